//! The Kubernetes semver library: `semver`, `isSemver` (both with the normalize flag), `major`,
//! `minor`, `patch`, and the comparisons it shares with quantity. The value type is
//! `value::semver`.
use super::overload::{Resolved, Sig};
use super::price::{k8s_size, tenths};
use crate::cel::func::Func;
use crate::cel::types::Ty;
use crate::cel::value::{EvalResult, Value, b, no_overload, semver};
use std::sync::Arc;

/// The names this library declares (a call with other arguments finds no overload).
pub(super) const NAMES: &[&str] = &[
    "semver",
    "isSemver",
    "major",
    "minor",
    "patch",
    "isGreaterThan",
    "isLessThan",
    "compareTo",
];

pub(super) fn resolve(s: &Sig) -> Option<Resolved> {
    use Func as F;
    use Ty::*;
    let (name, _t, n) = (s.name, s.t, s.t.len());
    match (name, s.member, n) {
        ("semver", false, 1) if s.is(0, &Str) => ok!(F::Semver, Semver),
        ("semver", false, 2) if s.is(0, &Str) && s.is(1, &Bool) => ok!(F::Semver, Semver),
        ("isSemver", false, 1) if s.is(0, &Str) => ok!(F::IsSemver, Bool),
        ("isSemver", false, 2) if s.is(0, &Str) && s.is(1, &Bool) => ok!(F::IsSemver, Bool),
        ("major" | "minor" | "patch", true, 1) if s.is(0, &Semver) => match name {
            "major" => ok!(F::Major, Int),
            "minor" => ok!(F::Minor, Int),
            _ => ok!(F::Patch, Int),
        },
        ("isGreaterThan" | "isLessThan" | "compareTo", true, 2)
            if s.is(0, &Semver) && s.is(1, &Semver) =>
        {
            match name {
                "isGreaterThan" => ok!(F::IsGreaterThan, Bool),
                "isLessThan" => ok!(F::IsLessThan, Bool),
                _ => ok!(F::CompareTo, Int),
            }
        }
        _ => None,
    }
}

pub(super) fn call(f: Func, a: &[Value]) -> EvalResult {
    use Value::*;
    match f {
        Func::Semver | Func::IsSemver => {
            let Str(s) = &a[0] else { return no_overload() };
            let norm = match a.get(1) {
                None => false,
                Some(Bool(x)) => *x,
                Some(_) => return no_overload(),
            };
            let r = if norm {
                semver::Semver::parse_normalized(s)
            } else {
                semver::Semver::parse(s)
            };
            if f == Func::IsSemver {
                return b(r.is_ok());
            }
            r.map(|v| Semver(Arc::new(v)))
        }
        Func::Major | Func::Minor | Func::Patch => {
            let Semver(v) = &a[0] else {
                return no_overload();
            };
            let x = match f {
                Func::Major => v.major,
                Func::Minor => v.minor,
                _ => v.patch,
            };
            // Go's `types.Int(v.Major)`: a component above 2^63 - 1 wraps negative
            Ok(Int(x.cast_signed()))
        }
        Func::IsGreaterThan | Func::IsLessThan | Func::CompareTo => {
            let (Semver(x), Semver(y)) = (&a[0], &a[1]) else {
                return no_overload();
            };
            Ok(super::quantity::ordering(f, x.compare(y)))
        }
        _ => no_overload(),
    }
}

pub(super) fn cost(f: Func, a: &[Value]) -> u64 {
    let k8s_sz = |i: usize| a.get(i).map(k8s_size).unwrap_or(1);
    match f {
        Func::Semver | Func::IsSemver => tenths(k8s_sz(0), 1),
        _ => 1,
    }
}
