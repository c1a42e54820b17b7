//! Runtime values of the DRA CEL environment.
//!
//! The value types of the Kubernetes libraries live here too, each with its own parsing, printing
//! and comparison, and none with CEL library code (that is `lib`): `quantity`, `semver`, `net`
//! (IP addresses and prefixes), `url` and `named_format`.
pub mod named_format;
pub mod net;
pub mod quantity;
pub mod semver;
pub mod url;

use named_format::NamedFormat;
use net::{Addr, Prefix};
use quantity::Quantity;
use semver::Semver;
use std::cmp::Ordering;
use std::sync::Arc;
use url::Url;

#[derive(Clone, Debug)]
pub enum Value {
    Null,
    Bool(bool),
    Int(i64),
    Uint(u64),
    Double(f64),
    Str(Arc<str>),
    Bytes(Arc<[u8]>),
    List(Arc<Vec<Value>>),
    Map(Arc<MapVal>),
    Quantity(Quantity),
    Semver(Arc<Semver>),
    Ip(Arc<Addr>),
    Cidr(Arc<Prefix>),
    Url(Arc<Url>),
    Format(&'static NamedFormat),
    Optional(Option<Arc<Value>>),
    Type(&'static str),
    Device(Arc<DeviceVal>),
}

/// A CEL map. Small (≤32 entries in DRA), so a vector with linear lookup beats hashing.
/// `default_empty` marks `device.attributes` / `device.capacity`: a missing domain reads as an
/// empty map (what the Kubernetes `mapper` wrapper does), while `in` still says false.
#[derive(Debug, Default)]
pub struct MapVal {
    pub entries: Vec<(Value, Value)>,
    pub default_empty: bool,
    /// A Go map with string keys behind it (the device's attributes and capacities, a URL's
    /// query): cel-go finds no key of another type there. Otherwise the map is cel-go's map of
    /// CEL values (literals, `insert`), into which Go hashes the key of every lookup: see
    /// [`hashable`].
    pub native: bool,
}

#[derive(Debug)]
pub struct DeviceVal {
    pub driver: Value,
    pub attributes: Value,
    pub capacity: Value,
    pub allow_multiple_allocations: bool,
}

pub type EvalResult = Result<Value, String>;

/// cel-go's error for a call whose arguments no overload takes.
pub fn no_overload<T>() -> Result<T, String> {
    Err(NO_OVERLOAD.to_string())
}

/// A length or a position as a CEL `int`. Rust keeps every length within `isize::MAX`, so this
/// never saturates.
pub fn int_len(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// cel-go's `doubleToInt64Checked`: the double truncated toward zero, when it lies strictly
/// between -2^63 and 2^63 (so never NaN or infinite).
pub fn double_to_int(d: f64) -> Option<i64> {
    const TWO_63: f64 = 9_223_372_036_854_775_808.0;
    if -TWO_63 < d && d < TWO_63 {
        #[allow(
            clippy::cast_possible_truncation,
            reason = "in range, checked just above; `as` truncates toward zero like Go's int64()"
        )]
        let i = d as i64;
        Some(i)
    } else {
        None
    }
}

/// cel-go's `doubleToUint64Checked`: the double truncated toward zero, when it lies in
/// [0, 2^64) (so never NaN or infinite).
pub fn double_to_uint(d: f64) -> Option<u64> {
    const TWO_64: f64 = 18_446_744_073_709_551_616.0;
    if (0.0..TWO_64).contains(&d) {
        #[allow(
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss,
            reason = "in range, checked just above; `as` truncates toward zero like Go's uint64()"
        )]
        let u = d as u64;
        Some(u)
    } else {
        None
    }
}

/// cel-go's `doubleToInt64Lossless`: the int a double equals exactly, if there is one.
pub fn double_to_int_lossless(d: f64) -> Option<i64> {
    double_to_int(d).filter(|_| d.fract() == 0.0)
}

/// cel-go's `doubleToUint64Lossless`.
pub fn double_to_uint_lossless(d: f64) -> Option<u64> {
    double_to_uint(d).filter(|_| d.fract() == 0.0)
}

/// A boolean result.
pub fn b(v: bool) -> EvalResult {
    Ok(Value::Bool(v))
}

pub const NO_OVERLOAD: &str = "no such overload";
/// `string(bytes)` on bytes that are not UTF-8 (also inside `format`'s `%s`).
pub const BYTES_NOT_UTF8: &str = "invalid UTF-8 in bytes, cannot convert to string";

impl Value {
    pub fn str(s: &str) -> Value {
        Value::Str(Arc::from(s))
    }
    /// The empty map Kubernetes reads a missing attribute or capacity domain as.
    pub fn empty_map() -> Value {
        Value::Map(Arc::new(MapVal::native(Vec::new())))
    }
    pub fn type_name(&self) -> &'static str {
        match self {
            Value::Null => "null_type",
            Value::Bool(_) => "bool",
            Value::Int(_) => "int",
            Value::Uint(_) => "uint",
            Value::Double(_) => "double",
            Value::Str(_) => "string",
            Value::Bytes(_) => "bytes",
            Value::List(_) => "list",
            Value::Map(_) => "map",
            Value::Quantity(_) => "kubernetes.Quantity",
            Value::Semver(_) => "kubernetes.Semver",
            Value::Ip(_) => "net.IP",
            Value::Cidr(_) => "net.CIDR",
            Value::Url(_) => "kubernetes.URL",
            Value::Format(_) => "kubernetes.NamedFormat",
            Value::Optional(_) => "optional_type",
            Value::Type(_) => "type",
            Value::Device(_) => "kubernetes.DRADevice",
        }
    }
    /// The cel-go Go type name used in some runtime errors (`types.Int`, ...).
    pub fn go_type_name(&self) -> &'static str {
        match self {
            Value::Null => "types.Null",
            Value::Bool(_) => "types.Bool",
            Value::Int(_) => "types.Int",
            Value::Uint(_) => "types.Uint",
            Value::Double(_) => "types.Double",
            Value::Str(_) => "types.String",
            Value::Bytes(_) => "types.Bytes",
            Value::List(_) => "types.baseList",
            Value::Map(_) => "types.baseMap",
            Value::Quantity(_) => "cel.Quantity",
            Value::Semver(_) => "cel.Semver",
            Value::Ip(_) => "cel.IP",
            Value::Cidr(_) => "cel.CIDR",
            Value::Url(_) => "cel.URL",
            Value::Format(_) => "cel.Format",
            Value::Optional(_) => "*types.Optional",
            Value::Type(_) => "*types.Type",
            Value::Device(_) => "*types.baseMap",
        }
    }
}

/// Keys equal as Go map keys: the same type and value; the values Go holds by pointer (lists,
/// maps, URLs, quantities, optionals) only as the same value.
fn same_key(a: &Value, b: &Value) -> bool {
    use Value::*;
    match (a, b) {
        (Null, Null) => true,
        (Bool(x), Bool(y)) => x == y,
        (Int(x), Int(y)) => x == y,
        (Uint(x), Uint(y)) => x == y,
        (Double(x), Double(y)) => x == y,
        (Str(x), Str(y)) => x == y,
        (Ip(x), Ip(y)) => x == y,
        (Cidr(x), Cidr(y)) => x == y,
        (Type(x), Type(y)) => x == y,
        (List(x), List(y)) => Arc::ptr_eq(x, y),
        (Map(x), Map(y)) => Arc::ptr_eq(x, y),
        (Url(x), Url(y)) => Arc::ptr_eq(x, y),
        _ => false,
    }
}

/// Whether Go can hash `key` into a map (or a set): not bytes (a slice), semver (holds slices)
/// or a named format (holds a function). Hashing one panics; cel-go recovers the panic into
/// this error.
pub fn hashable(key: &Value) -> Result<(), String> {
    match key {
        Value::Bytes(_) | Value::Semver(_) | Value::Format(_) => Err(format!(
            "internal error: runtime error: hash of unhashable type {}",
            key.go_type_name()
        )),
        _ => Ok(()),
    }
}

impl MapVal {
    /// A map of strings from a Go map (see `native`).
    pub fn native(entries: Vec<(Value, Value)>) -> MapVal {
        MapVal {
            entries,
            default_empty: false,
            native: true,
        }
    }

    /// A key lookup as cel-go's map makes it: [`MapVal::get`], after hashing the key into a
    /// non-empty map of CEL values.
    pub fn find(&self, key: &Value) -> Result<Option<&Value>, String> {
        if !self.native && !self.entries.is_empty() {
            hashable(key)?;
        }
        Ok(self.get(key))
    }

    pub fn get(&self, key: &Value) -> Option<&Value> {
        if let Value::Str(k) = key {
            for (ek, ev) in &self.entries {
                if let Value::Str(s) = ek
                    && s.as_ref() == k.as_ref()
                {
                    return Some(ev);
                }
            }
            return None;
        }
        // cel-go looks the key up as it is, then a number as a lossless int and uint (never as
        // a double: `1` does not find the key `1.0`, but `1.0` finds `1`)
        let find = |k: &Value| self.entries.iter().find(|(ek, _)| same_key(ek, k));
        let alt: [Option<Value>; 2] = match key {
            Value::Double(d) => [
                double_to_int_lossless(*d).map(Value::Int),
                double_to_uint_lossless(*d).map(Value::Uint),
            ],
            Value::Int(i) => [u64::try_from(*i).ok().map(Value::Uint), None],
            Value::Uint(u) => [i64::try_from(*u).ok().map(Value::Int), None],
            _ => [None, None],
        };
        find(key)
            .or_else(|| alt.iter().flatten().find_map(find))
            .map(|(_, v)| v)
    }
    pub fn get_str(&self, key: &str) -> Option<&Value> {
        self.entries.iter().find_map(|(ek, ev)| match ek {
            Value::Str(s) if s.as_ref() == key => Some(ev),
            _ => None,
        })
    }
}

/// cel-go numeric cross-type comparison.
pub fn num_cmp(a: &Value, b: &Value) -> Option<Ordering> {
    use Value::*;
    Some(match (a, b) {
        (Int(x), Int(y)) => x.cmp(y),
        (Uint(x), Uint(y)) => x.cmp(y),
        (Double(x), Double(y)) => x.partial_cmp(y)?,
        // a negative int is below every uint
        (Int(x), Uint(y)) => match u64::try_from(*x) {
            Ok(x) => x.cmp(y),
            Err(_) => Ordering::Less,
        },
        (Uint(x), Int(y)) => match u64::try_from(*y) {
            Ok(y) => x.cmp(&y),
            Err(_) => Ordering::Greater,
        },
        (Int(x), Double(y)) => cmp_i_d(*x as f64, *y)?,
        (Double(x), Int(y)) => cmp_i_d(*x, *y as f64)?,
        (Uint(x), Double(y)) => cmp_i_d(*x as f64, *y)?,
        (Double(x), Uint(y)) => cmp_i_d(*x, *y as f64)?,
        _ => return None,
    })
}

fn cmp_i_d(a: f64, b: f64) -> Option<Ordering> {
    a.partial_cmp(&b)
}

/// cel-go heterogeneous equality (`types.Equal` then `lhs.Equal(rhs)`). Kubernetes types fail
/// against another type; lists and maps take such a failing member as equal (they stop only at a
/// member that is not), optionals pass the error on.
pub fn equals(a: &Value, b: &Value) -> Result<bool, String> {
    use Value::*;
    Ok(match (a, b) {
        (Null, Null) => true,
        (Null, _) | (_, Null) => false,
        (Bool(x), Bool(y)) => x == y,
        (Str(x), Str(y)) => x == y,
        (Bytes(x), Bytes(y)) => x == y,
        (Int(_) | Uint(_) | Double(_), Int(_) | Uint(_) | Double(_)) => {
            num_cmp(a, b) == Some(Ordering::Equal)
        }
        (List(x), List(y)) => {
            if x.len() != y.len() {
                return Ok(false);
            }
            // cel-go stops at the first member that is not equal; an error is not "not equal"
            x.iter()
                .zip(y.iter())
                .all(|(p, q)| !matches!(equals(p, q), Ok(false)))
        }
        (Map(x), Map(y)) => {
            if x.entries.len() != y.entries.len() {
                return Ok(false);
            }
            // each key looked up in the other map as cel-go does: `device.attributes` and
            // `device.capacity` find any domain (an empty one), so equality is not symmetric
            for (k, v) in &x.entries {
                let w = match y.get(k) {
                    Some(w) => w.clone(),
                    None if y.default_empty => Value::empty_map(),
                    None => return Ok(false),
                };
                if matches!(equals(v, &w), Ok(false)) {
                    return Ok(false);
                }
            }
            true
        }
        // cel-go's `Quantity.Equal` takes a value, not the pointer `add`/`sub` return
        (Quantity(x), Quantity(y)) if !y.is_by_pointer() => x.cmp_q(y) == Ordering::Equal,
        (Quantity(_), _) => return Err(NO_OVERLOAD.into()),
        (Semver(x), Semver(y)) => x.compare(y) == Ordering::Equal,
        (Semver(_), _) => return Err(NO_OVERLOAD.into()),
        (Ip(x), Ip(y)) => x == y,
        (Ip(_), _) => return Err(NO_OVERLOAD.into()),
        (Cidr(x), Cidr(y)) => x == y,
        (Cidr(_), _) => return Err(NO_OVERLOAD.into()),
        (Url(x), Url(y)) => x.same(y),
        (Url(_), _) => return Err(NO_OVERLOAD.into()),
        (Format(x), Format(y)) => x.name == y.name,
        (Format(_), _) => return Err(NO_OVERLOAD.into()),
        (Optional(x), Optional(y)) => match (x, y) {
            (None, None) => true,
            (Some(p), Some(q)) => equals(p, q)?,
            _ => false,
        },
        (Type(x), Type(y)) => x == y,
        _ => false,
    })
}
