//! The sample messages of one poll parsed into columns in one call (`schemas.poll_decode` calls it).
//!
//! This is only the happy path. A message is taken when it parses into the shape that msgspec's `_Wire`
//! accepts in `schemas.codec`, its version is the wire's, its node, GPU and clock are not empty, its sensor is
//! absent or the topic's, and its stamps and values are both scalars or both non-empty lists of one length.
//! When any message of the poll is not taken, the answer is None and the Python path decodes the poll, so
//! every reject keeps its reason. Ranges and time limits are checked in Python, vectorised over the columns.

use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt;
use std::marker::PhantomData;

use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyBytes, PyList, PyString, PyTuple};
use serde::de::{self, Deserializer, IntoDeserializer, SeqAccess, Visitor};
use serde::Deserialize;
use sonic_rs::LazyValue;

/// One number or a list of them. Each scalar goes through `T`'s own rules (serde's primitive deserializers): an
/// int64 stamp refuses floats and integers beyond int64 (as msgspec's `int` does), a float value takes integers
/// as Python's float() rounds them.
enum OneOrMany<T> {
    One(T),
    Many(Vec<T>),
}

struct OneOrManyVisitor<T>(PhantomData<T>);

impl<'de, T: Deserialize<'de>> Visitor<'de> for OneOrManyVisitor<T> {
    type Value = OneOrMany<T>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a number or a list of them")
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
        T::deserialize(v.into_deserializer()).map(OneOrMany::One)
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
        T::deserialize(v.into_deserializer()).map(OneOrMany::One)
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Self::Value, E> {
        T::deserialize(v.into_deserializer()).map(OneOrMany::One)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(8));
        while let Some(x) = seq.next_element::<T>()? {
            out.push(x);
        }
        Ok(OneOrMany::Many(out))
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for OneOrMany<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(OneOrManyVisitor(PhantomData))
    }
}

fn utc() -> Cow<'static, str> {
    Cow::Borrowed("utc")
}

/// `schemas.codec._Wire`: unknown fields are skipped, a duplicate field is refused (the Python path decides).
#[derive(Deserialize)]
struct Wire<'a> {
    v: i64,
    #[serde(borrow)]
    node: Cow<'a, str>,
    #[serde(borrow)]
    gpu: Cow<'a, str>,
    ts_ns: OneOrMany<i64>,
    value: OneOrMany<f64>,
    // A default, not an Option: `"clock": null` is refused, as msgspec's `str` refuses it.
    #[serde(borrow, default = "utc")]
    clock: Cow<'a, str>,
    // Absent and null alike: the Python side reads both as no labels.
    #[serde(borrow, default)]
    labels: Option<LazyValue<'a>>,
    #[serde(borrow, default)]
    sensor: Option<Cow<'a, str>>,
}

/// One Python object per distinct text, shared by every message that carries it.
struct Interned<'py, T> {
    py: Python<'py>,
    seen: HashMap<String, Bound<'py, T>>,
}

impl<'py> Interned<'py, PyString> {
    fn get(&mut self, s: &str) -> Bound<'py, PyString> {
        if let Some(o) = self.seen.get(s) {
            return o.clone();
        }
        let o = PyString::new(self.py, s);
        self.seen.insert(s.to_owned(), o.clone());
        o
    }
}

impl<'py> Interned<'py, PyBytes> {
    fn get(&mut self, s: &str) -> Bound<'py, PyBytes> {
        if let Some(o) = self.seen.get(s) {
            return o.clone();
        }
        let o = PyBytes::new(self.py, s.as_bytes());
        self.seen.insert(s.to_owned(), o.clone());
        o
    }
}

fn interned<'py, T>(py: Python<'py>) -> Interned<'py, T> {
    Interned { py, seen: HashMap::new() }
}

/// Whether the message may hold a number written as negative zero (`-0.0`, `-0e5`): the parser reads them as
/// +0.0 where msgspec keeps the sign. One inside a string answers yes too, which only sends the poll to msgspec.
fn negative_zero(raw: &[u8]) -> bool {
    raw.windows(2).enumerate().any(|(i, w)| {
        w == b"-0"
            && (i == 0 || matches!(raw[i - 1], b'[' | b',' | b':' | b' ' | b'\t' | b'\n' | b'\r'))
            && raw[i + 1..].iter().take_while(|c| !matches!(c, b'e' | b'E')).take_while(|c| c.is_ascii_digit() || **c == b'.')
                .all(|c| matches!(c, b'0' | b'.'))
    })
}

/// `(nodes, gpus, clocks, labels, lens, ts, values)` for the messages of a poll of one sensor, in their order:
/// per message its node, GPU and clock (str), its labels' JSON text (bytes, None when absent or null) and its
/// sample count; `ts` and `values` are every sample's stamp and value back to back, as native int64 and float64
/// bytes. None when a message is not bytes or not on the happy path (see the module's docs).
#[pyfunction]
fn sample_columns<'py>(
    py: Python<'py>,
    raws: &Bound<'py, PyList>,
    version: i64,
    sensor: &str,
) -> PyResult<Option<Bound<'py, PyTuple>>> {
    let n = raws.len();
    let (mut nodes, mut gpus, mut clocks) = (Vec::with_capacity(n), Vec::with_capacity(n), Vec::with_capacity(n));
    let mut labels: Vec<Bound<'py, PyAny>> = Vec::with_capacity(n);
    let mut lens: Vec<usize> = Vec::with_capacity(n);
    let (mut ts, mut vs): (Vec<u8>, Vec<u8>) = (Vec::with_capacity(8 * n), Vec::with_capacity(8 * n));
    let mut node_of: Interned<PyString> = interned(py);
    let mut gpu_of: Interned<PyString> = interned(py);
    let mut clock_of: Interned<PyString> = interned(py);
    let mut labels_of: Interned<PyBytes> = interned(py);
    let none = py.None().into_bound(py);
    for item in raws.iter() {
        let Ok(bytes) = item.downcast::<PyBytes>() else { return Ok(None) };
        let Ok(w) = sonic_rs::from_slice::<Wire>(bytes.as_bytes()) else { return Ok(None) };
        if w.v != version || w.node.is_empty() || w.gpu.is_empty() || w.clock.is_empty() {
            return Ok(None);
        }
        if let Some(s) = &w.sensor {
            if s != sensor {
                return Ok(None);
            }
        }
        let one;
        let (tl, vl): (&[i64], &[f64]) = match (&w.ts_ns, &w.value) {
            (OneOrMany::One(t), OneOrMany::One(v)) => {
                one = ([*t], [*v]);
                (&one.0, &one.1)
            }
            (OneOrMany::Many(tl), OneOrMany::Many(vl)) if tl.len() == vl.len() && !tl.is_empty() => (tl, vl),
            _ => return Ok(None),
        };
        if !vl.iter().all(|v| v.is_finite()) || (vl.contains(&0.0) && negative_zero(bytes.as_bytes())) {
            return Ok(None);
        }
        for t in tl {
            ts.extend_from_slice(&t.to_ne_bytes());
        }
        for v in vl {
            vs.extend_from_slice(&v.to_ne_bytes());
        }
        let len = tl.len();
        lens.push(len);
        nodes.push(node_of.get(&w.node));
        gpus.push(gpu_of.get(&w.gpu));
        clocks.push(clock_of.get(&w.clock));
        labels.push(match w.labels {
            Some(raw) => labels_of.get(raw.as_raw_str()).into_any(),
            None => none.clone(),
        });
    }
    let out: [Bound<'py, PyAny>; 7] = [
        PyList::new(py, nodes)?.into_any(),
        PyList::new(py, gpus)?.into_any(),
        PyList::new(py, clocks)?.into_any(),
        PyList::new(py, labels)?.into_any(),
        PyList::new(py, lens)?.into_any(),
        PyByteArray::new(py, &ts).into_any(),
        PyByteArray::new(py, &vs).into_any(),
    ];
    Ok(Some(PyTuple::new(py, out)?))
}

#[pymodule]
fn flopwatch_native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(sample_columns, m)?)?;
    Ok(())
}
