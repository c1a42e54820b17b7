//! ext.Sets: `sets.contains`, `sets.equivalent`, `sets.intersects`.
use super::overload::{Resolved, Sig};
use super::price::size;
use crate::cel::func::Func;
use crate::cel::types::Ty;
use crate::cel::value::{EvalResult, Value, b, equals, no_overload};

/// The names this library declares (a call with other arguments finds no overload).
pub(super) const NAMES: &[&str] = &["sets.contains", "sets.equivalent", "sets.intersects"];

pub(super) fn resolve(s: &Sig) -> Option<Resolved> {
    use Func as F;
    use Ty::*;
    let (name, t, n) = (s.name, s.t, s.t.len());
    match (name, s.member, n) {
        ("sets.contains" | "sets.equivalent" | "sets.intersects", false, 2)
            if s.list_like(0) && s.list_like(1) =>
        {
            if t[0].unify(&t[1]).is_none() {
                return Some(Err(None));
            }
            match name {
                "sets.contains" => ok!(F::SetsContains, Bool),
                "sets.equivalent" => ok!(F::SetsEquivalent, Bool),
                _ => ok!(F::SetsIntersects, Bool),
            }
        }
        _ => None,
    }
}

pub(super) fn call(f: Func, a: &[Value]) -> EvalResult {
    use Value::*;
    match f {
        Func::SetsContains | Func::SetsEquivalent | Func::SetsIntersects => {
            let (List(x), List(y)) = (&a[0], &a[1]) else {
                return no_overload();
            };
            let has = |l: &[Value], v: &Value| l.iter().any(|e| equals(e, v).unwrap_or(false));
            b(match f {
                Func::SetsContains => y.iter().all(|v| has(x, v)),
                Func::SetsEquivalent => y.iter().all(|v| has(x, v)) && x.iter().all(|v| has(y, v)),
                _ => y.iter().any(|v| has(x, v)),
            })
        }
        _ => no_overload(),
    }
}

pub(super) fn cost(f: Func, a: &[Value]) -> u64 {
    let sz = |i: usize| a.get(i).map(size).unwrap_or(1);
    match f {
        Func::SetsContains | Func::SetsIntersects => 1 + sz(0) * sz(1),
        Func::SetsEquivalent => 1 + 2 * sz(0) * sz(1),
        _ => 1,
    }
}
