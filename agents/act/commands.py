"""What ``flopwatch act`` would run for a trigger: the kubectl argument list and its dry-run line.

Pure: no I/O. A trigger's namespace and workload come from Kafka, so they are checked as
Kubernetes names before they go anywhere near a command; the idempotency key is opaque and
is only ever shown escaped, so no trigger can add a line (or a command) to the output.

The workload is taken to be a Deployment of the same name in the namespace.

>>> from schemas.triggers import make_trigger
>>> t = make_trigger("scale_up", "serving", "chat", "inference", ts_ns=1_796_200_344_000_000_000, current=4,
...                  desired=6, reasons=("qps",), evidence={})
>>> kubectl_args(t)
['scale', 'deployment/chat', '--namespace', 'serving', '--replicas=6']
>>> command, comment = dry_run_line(t).split("  # ")
>>> print(command); print(comment)
kubectl scale deployment/chat --namespace serving --replicas=6
scale_up idempotency_key="serving/chat/scale_up/1796200344000000000"
"""

from __future__ import annotations

import json
import re
import shlex
from typing import Final

from schemas.triggers import Trigger

# RFC 1123 label (namespaces) and subdomain (Deployment names), as the Kubernetes API validates them.
_LABEL: Final = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_SUBDOMAIN: Final = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_HEX32: Final = re.compile(r"[0-9a-f]{32}")
LABEL_MAX: Final = 63
SUBDOMAIN_MAX: Final = 253


class UnsafeName(ValueError):
    """A namespace or workload that is not a valid Kubernetes name: it is never put into a command."""


def namespace_error(name: str) -> str | None:
    """Why ``name`` is not a valid namespace (an RFC 1123 label), or None.

    >>> namespace_error("serving") is None, namespace_error("Serving")[:34], namespace_error("a" * 64)[-25:]
    (True, "'Serving' is not an RFC 1123 label", 'longer than 63 characters')
    """
    if len(name) > LABEL_MAX:
        return f"{name[:LABEL_MAX]!r}... is longer than {LABEL_MAX} characters"
    if not _LABEL.fullmatch(name):
        return (f"{name!r} is not an RFC 1123 label (lower-case letters, digits and '-', starting and ending "
                "alphanumeric)")
    return None


def workload_error(name: str) -> str | None:
    """Why ``name`` is not a valid Deployment name (an RFC 1123 subdomain), or None.

    >>> workload_error("chat-v2.eu"), workload_error("chat;rm -rf /") is not None
    (None, True)
    """
    if len(name) > SUBDOMAIN_MAX:
        return f"{name[:40]!r}... is longer than {SUBDOMAIN_MAX} characters"
    if not _SUBDOMAIN.fullmatch(name):
        return (f"{name!r} is not an RFC 1123 subdomain (lower-case letters, digits, '-' and '.', each part "
                "starting and ending alphanumeric)")
    return None


def check_names(t: Trigger) -> None:
    """Raise ``UnsafeName`` naming the first of the trigger's names that Kubernetes would not accept."""
    for what, err in (("namespace", namespace_error(t.namespace)), ("workload", workload_error(t.workload))):
        if err is not None:
            raise UnsafeName(f"{what} {err}")


def kubectl_args(t: Trigger) -> list[str]:
    """kubectl's arguments (without ``kubectl``) for ``t``; raises ``UnsafeName`` first if a name is unsafe.

    >>> from schemas.triggers import make_trigger
    >>> kubectl_args(make_trigger("rebalance", "ml", "trainer", "training", ts_ns=1, current=8, desired=8,
    ...                           reasons=("efficiency_drift",), evidence={}))
    ['rollout', 'restart', 'deployment/trainer', '--namespace', 'ml']
    """
    check_names(t)
    target = f"deployment/{t.workload}"
    if t.action == "rebalance":
        # The replica count stays: restarting the pods lets the scheduler place the work afresh.
        return ["rollout", "restart", target, "--namespace", t.namespace]
    return ["scale", target, "--namespace", t.namespace, f"--replicas={t.desired}"]


def shown(text: str) -> str:
    """``text`` as a double-quoted, escaped string on one line: safe to print after a command.

    >>> print(shown('a/b'), shown('x\\nkubectl delete ns prod'))
    "a/b" "x\\nkubectl delete ns prod"
    """
    return json.dumps(text, ensure_ascii=True)


def dry_run_line(t: Trigger, kubectl: str = "kubectl") -> str:
    """One line: the command ``t`` asks for, then a shell comment naming the decision (and what a rollback undoes).

    >>> from schemas.triggers import make_trigger
    >>> line = dry_run_line(make_trigger("rollback", "serving", "chat", "inference", ts_ns=5, current=3, desired=4,
    ...                                  reasons=("sla_breach",), evidence={}, reverses="0" * 32))
    >>> command, comment = line.split("  # ")
    >>> print(command); print(comment)
    kubectl scale deployment/chat --namespace serving --replicas=4
    rollback of decision 00000000000000000000000000000000 idempotency_key="serving/chat/rollback/5"
    """
    command = " ".join(shlex.quote(a) for a in [kubectl, *kubectl_args(t)])
    what: str = t.action
    if t.action == "rollback":
        # The schema makes ``reverses`` 32 hex digits; shown escaped all the same if a caller built it otherwise.
        rev = t.reverses or "(not named)"
        what = f"rollback of decision {rev if _HEX32.fullmatch(rev) else shown(rev)}"
    return f"{command}  # {what} idempotency_key={shown(t.idempotency_key)}"
