//! Regular expressions: the standard `matches` and the Kubernetes regex library's `find` and
//! `findAll`, by the pattern's value or, for a literal pattern, with the regex compiled once
//! (`Node::RegexCall`).
use super::overload::{Resolved, Sig};
use super::price::{k8s_size, match_cost, size};
use crate::cel::func::Func;
use crate::cel::types::Ty;
use crate::cel::value::{EvalResult, Value, b, no_overload};
use std::sync::Arc;

/// The names this library declares (a call with other arguments finds no overload).
pub(super) const NAMES: &[&str] = &["matches", "find", "findAll"];

pub(super) fn resolve(s: &Sig) -> Option<Resolved> {
    use Func as F;
    use Ty::*;
    let (name, _t, n) = (s.name, s.t, s.t.len());
    Some(match (name, s.member, n) {
        ("matches", _, 2) => {
            if s.is(0, &Str) && s.is(1, &Str) {
                ok!(F::Matches, Bool)
            }
            Err(None)
        }
        ("find", true, 2) if s.is(0, &Str) && s.is(1, &Str) => ok!(F::Find, Str),
        ("findAll", true, 2) if s.is(0, &Str) && s.is(1, &Str) => {
            ok!(F::FindAll, List(Box::new(Str)))
        }
        ("findAll", true, 3) if s.is(0, &Str) && s.is(1, &Str) && s.is(2, &Int) => {
            ok!(F::FindAll, List(Box::new(Str)))
        }
        _ => return None,
    })
}

pub(super) fn call(f: Func, a: &[Value]) -> EvalResult {
    use Value::*;
    match f {
        Func::Matches | Func::Find | Func::FindAll => {
            let (Str(s), Str(p)) = (&a[0], &a[1]) else {
                return no_overload();
            };
            let re =
                ::regex::Regex::new(p).map_err(|e| format!("invalid matches argument: {e}"))?;
            match f {
                Func::Matches => b(re.is_match(s)),
                Func::Find => Ok(Value::str(re.find(s).map(|m| m.as_str()).unwrap_or(""))),
                _ => {
                    // a negative limit is no limit
                    let limit = match a.get(2) {
                        Some(Int(n)) => usize::try_from(*n).unwrap_or(usize::MAX),
                        _ => usize::MAX,
                    };
                    Ok(List(Arc::new(
                        re.find_iter(s)
                            .take(limit)
                            .map(|m| Value::str(m.as_str()))
                            .collect(),
                    )))
                }
            }
        }
        _ => no_overload(),
    }
}

pub(super) fn cost(f: Func, a: &[Value]) -> u64 {
    let sz = |i: usize| a.get(i).map(size).unwrap_or(1);
    let k8s_sz = |i: usize| a.get(i).map(k8s_size).unwrap_or(1);
    match f {
        Func::Matches | Func::Find | Func::FindAll => {
            let regex = if f == Func::Matches { sz(1) } else { k8s_sz(1) };
            let s = if f == Func::Matches { sz(0) } else { k8s_sz(0) };
            match_cost(s, regex)
        }
        _ => 1,
    }
}

/// The price of a regex call with a literal pattern (`Node::RegexCall`) on its target's value.
pub(crate) fn literal_cost(f: Func, target: &Value, re: &::regex::Regex) -> u64 {
    let len = if f == Func::Matches {
        size(target)
    } else {
        k8s_size(target)
    };
    match_cost(len, re.as_str().chars().count() as u64)
}

/// A regex call with a literal pattern (`Node::RegexCall`), compiled when the program was.
pub(crate) fn call_literal(f: Func, target: Value, re: &::regex::Regex) -> EvalResult {
    let Value::Str(s) = target else {
        return no_overload();
    };
    match f {
        Func::Matches => b(re.is_match(&s)),
        Func::Find => Ok(Value::str(re.find(&s).map(|m| m.as_str()).unwrap_or(""))),
        _ => Ok(Value::List(Arc::new(
            re.find_iter(&s).map(|m| Value::str(m.as_str())).collect(),
        ))),
    }
}
