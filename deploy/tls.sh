# deploy/tls.sh — a throw-away CA and a server certificate for 127.0.0.1, for the local test services
# (sourced, not run; kafka_secure.sh and clickhouse.sh use it). The caller defines die().
#
# make_test_tls DIR: DIR/ca.pem (the CA clients trust), DIR/server.key and DIR/server.crt (PEM, the key
# PKCS#8 and unencrypted) and DIR/server.pem (key, certificate, CA: a PEM keystore); made once, kept.
make_test_tls() {
  local d="$1"
  [[ -s "$d/ca.pem" && -s "$d/server.pem" ]] && return 0
  command -v openssl >/dev/null || die "openssl not found (needed for the TLS certificates)"
  mkdir -p "$d"
  (
    umask 077
    openssl req -x509 -newkey rsa:2048 -nodes -days 30 -subj "/CN=flopwatch test CA" \
      -keyout "$d/ca.key" -out "$d/ca.pem" 2>/dev/null
    openssl req -newkey rsa:2048 -nodes -subj "/CN=127.0.0.1" -keyout "$d/server.rsa" -out "$d/server.csr" 2>/dev/null
    printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\n' >"$d/san.ext"
    openssl x509 -req -in "$d/server.csr" -CA "$d/ca.pem" -CAkey "$d/ca.key" -CAcreateserial -days 30 \
      -extfile "$d/san.ext" -out "$d/server.crt" 2>/dev/null
    openssl pkcs8 -topk8 -nocrypt -in "$d/server.rsa" -out "$d/server.key"
    cat "$d/server.key" "$d/server.crt" "$d/ca.pem" >"$d/server.pem"
  ) || die "openssl could not make the certificates"
  chmod 644 "$d/ca.pem" "$d/server.crt"
}
