//! ext.Lists v3 (`slice`, `flatten`, `distinct`, `lists.range`, `reverse`, `first`, `last`,
//! `sort`, the `sortBy` macro's sort, `indexOf` and `lastIndexOf` of lists) and the Kubernetes
//! lists library (`isSorted`, `sum`, `min`, `max`, `indexOf`/`lastIndexOf`, `includes`).
use super::overload::{Resolved, Sig};
use super::price::{list_alloc, size, traversal};
use crate::cel::func::Func;
use crate::cel::types::Ty;
use crate::cel::value::{EvalResult, NO_OVERLOAD, Value, b, equals, int_len, no_overload};
use std::cmp::Ordering;
use std::sync::Arc;

/// The names this library declares (a call with other arguments finds no overload).
pub(super) const NAMES: &[&str] = &[
    "isSorted",
    "sum",
    "min",
    "max",
    "slice",
    "flatten",
    "distinct",
    "sort",
    "first",
    "last",
    "lists.range",
    "includes",
    "indexOf",
    "lastIndexOf",
    "reverse",
];

/// The element types of the comparison overloads (`isSorted`, `min`, `max`, `sort`) and of
/// `sum`'s, as far as this environment has values of them (no durations or timestamps).
const COMPARABLE: &[Ty] = &[Ty::Int, Ty::Uint, Ty::Double, Ty::Bool, Ty::Str, Ty::Bytes];
const SUMMABLE: &[Ty] = &[Ty::Int, Ty::Uint, Ty::Double];

/// cel-go's checker over one overload `list(T) -> result(T)` per element type: the result of
/// the overload the receiver fits, `dyn` when it fits several with different results (a `dyn`
/// list, an attribute value).
fn per_elem(recv: &Ty, elems: &[Ty], result: impl Fn(&Ty) -> Ty) -> Option<Ty> {
    if *recv == Ty::list(Ty::Free) {
        // `[]`: the first overload binds its element type
        return elems.first().map(result);
    }
    let mut out: Option<Ty> = None;
    for e in elems
        .iter()
        .filter(|e| Ty::list((*e).clone()).accepts(recv))
    {
        let r = result(e);
        out = Some(match out {
            Some(prev) if prev != r => Ty::Dyn,
            _ => r,
        });
    }
    out
}

/// `list(T) -> list(T)`: the receiver's list type (a `dyn` receiver leaves `T` free: `dyn`).
fn same_list(recv: &Ty) -> Option<Ty> {
    match recv {
        Ty::List(_) => Some(recv.clone()),
        x if x.is_dyn() => Some(Ty::list(Ty::Dyn)),
        _ => None,
    }
}

/// `flatten()`: `list(list(T)) -> list(T)`.
fn flattened(recv: &Ty) -> Option<Ty> {
    match recv {
        Ty::List(e) => match &**e {
            Ty::List(inner) => Some(Ty::List(inner.clone())),
            x if x.is_dyn() => Some(Ty::list(Ty::Dyn)),
            _ => None,
        },
        x if x.is_dyn() => Some(Ty::list(Ty::Dyn)),
        _ => None,
    }
}

pub(super) fn resolve(s: &Sig) -> Option<Resolved> {
    use Func as F;
    use Ty::*;
    let (name, t, n) = (s.name, s.t, s.t.len());
    let found = |f: Func, r: Option<Ty>| r.map(|r| Ok((f, r)));
    match (name, s.member, n) {
        // `list(A).indexOf(A)`: the argument must fit the element type
        ("indexOf" | "lastIndexOf", true, 2) if s.list_like(0) && t[0].elem().accepts(&t[1]) => {
            ok!(
                if name == "indexOf" {
                    F::IndexOf
                } else {
                    F::LastIndexOf
                },
                Int
            )
        }
        ("reverse", true, 1) => found(F::Reverse, same_list(&t[0])),
        ("isSorted", true, 1) => found(F::IsSorted, per_elem(&t[0], COMPARABLE, |_| Bool)),
        ("sum", true, 1) => found(F::Sum, per_elem(&t[0], SUMMABLE, Ty::clone)),
        ("min" | "max", true, 1) => found(
            if name == "min" { F::Min } else { F::Max },
            per_elem(&t[0], COMPARABLE, Ty::clone),
        ),
        ("slice", true, 3) if s.is(1, &Int) && s.is(2, &Int) => found(F::Slice, same_list(&t[0])),
        ("flatten", true, 1) => found(F::Flatten, flattened(&t[0])),
        ("flatten", true, 2) if s.list_like(0) && s.is(1, &Int) => ok!(F::Flatten, Ty::list(Dyn)),
        ("distinct", true, 1) => found(F::Distinct, same_list(&t[0])),
        ("sort", true, 1) => found(
            F::Sort,
            per_elem(&t[0], COMPARABLE, |e| Ty::list(e.clone())),
        )
        .map(|r| r.map(|(f, ty)| (if ty == Dyn { F::SortDyn } else { f }, ty))),
        ("includes", true, 2) => ok!(F::Includes, Bool),
        ("first" | "last", true, 1) if s.list_like(0) => {
            ok!(
                if name == "first" { F::First } else { F::Last },
                Ty::opt(t[0].elem())
            )
        }
        ("lists.range", false, 1) if s.is(0, &Int) => ok!(F::ListsRange, List(Box::new(Int))),
        _ => None,
    }
}

/// ext.Lists' default cap on `lists.range`.
const MAX_RANGE: i64 = 10_000_000;

pub(super) fn call(f: Func, a: &[Value]) -> EvalResult {
    use Value::*;
    match f {
        Func::IndexOf | Func::LastIndexOf => index_of(f, a),
        Func::Reverse => match &a[0] {
            List(l) => Ok(List(Arc::new(l.iter().rev().cloned().collect()))),
            _ => no_overload(),
        },
        Func::IsSorted | Func::Sum | Func::Min | Func::Max | Func::Sort | Func::SortDyn => {
            aggregate(f, a)
        }
        Func::Slice => slice(a),
        Func::Flatten => flatten(a),
        Func::Distinct => {
            let List(l) = &a[0] else { return no_overload() };
            let mut out: Vec<Value> = Vec::new();
            for x in l.iter() {
                if !out.iter().any(|y| equals(x, y).unwrap_or(false)) {
                    out.push(x.clone());
                }
            }
            Ok(List(Arc::new(out)))
        }
        Func::ListsRange => {
            let Int(n) = &a[0] else { return no_overload() };
            if *n < 0 {
                return Err(format!("lists.range: size must be non-negative, got {n}"));
            }
            if *n > MAX_RANGE {
                return Err(format!(
                    "lists.range: size {n} exceeds maximum allowed ({MAX_RANGE})"
                ));
            }
            Ok(List(Arc::new((0..*n).map(Int).collect())))
        }
        Func::First | Func::Last => {
            let List(l) = &a[0] else { return no_overload() };
            let x = if f == Func::First {
                l.first()
            } else {
                l.last()
            };
            Ok(Optional(x.map(|v| Arc::new(v.clone()))))
        }
        Func::Includes => match &a[0] {
            List(l) => {
                for x in l.iter() {
                    if equals(x, &a[1]).unwrap_or(false) {
                        return b(true);
                    }
                }
                b(false)
            }
            x => b(equals(x, &a[1]).unwrap_or(false)),
        },
        Func::SortByKeys | Func::SortByKeysDyn => sort_by_keys(a),
        _ => no_overload(),
    }
}

/// `IndexOf`, `LastIndexOf`.
fn index_of(f: Func, a: &[Value]) -> EvalResult {
    use Value::*;
    match &a[0] {
        List(l) => {
            let mut it: Box<dyn Iterator<Item = (usize, &Value)>> = if f == Func::IndexOf {
                Box::new(l.iter().enumerate())
            } else {
                Box::new(l.iter().enumerate().rev())
            };
            Ok(Int(it
                .find(|(_, x)| equals(x, &a[1]).unwrap_or(false))
                .map(|(i, _)| int_len(i))
                .unwrap_or(-1)))
        }
        _ => no_overload(),
    }
}

/// The overload cel-go's runtime dispatch picks for a list function declared per element type:
/// by the type of the list's first member (an empty list takes the first overload, `int`).
/// `None` when no overload takes that type.
fn dispatch<'v>(l: &'v [Value], elems: &[&str]) -> Option<&'v Value> {
    match l.first() {
        None => Some(&Value::Int(0)),
        Some(v) if elems.contains(&v.type_name()) => Some(v),
        Some(_) => None,
    }
}

/// The types cel-go can compare (`traits.Comparer`).
fn comparer(v: &Value) -> bool {
    use Value::*;
    matches!(
        v,
        Bool(_) | Bytes(_) | Double(_) | Int(_) | Str(_) | Uint(_)
    )
}

/// `a.Compare(b)` where it gives an answer (cel-go's functions here ignore the errors).
fn order(a: &Value, b: &Value) -> Option<Ordering> {
    super::stdlib::compare(a, b).ok().flatten()
}

const COMPARABLE_NAMES: &[&str] = &["int", "uint", "double", "bool", "string", "bytes"];

/// `IsSorted`, `Sum`, `Min`, `Max` (the Kubernetes lists library), `Sort` (ext.Lists): after
/// cel-go's dispatch by the first member's type, each member is compared with (or added to)
/// the previous result; a comparison that fails counts as "not in order".
fn aggregate(f: Func, a: &[Value]) -> EvalResult {
    use Value::*;
    let List(l) = &a[0] else { return no_overload() };
    match f {
        Func::IsSorted => {
            dispatch(l, COMPARABLE_NAMES).ok_or(NO_OVERLOAD)?;
            let mut prev: Option<&Value> = None;
            for x in l.iter() {
                if !comparer(x) {
                    return no_overload();
                }
                if prev.is_some_and(|p| order(p, x) == Some(Ordering::Greater)) {
                    return b(false);
                }
                prev = Some(x);
            }
            b(true)
        }
        Func::Sum => {
            let mut acc = match dispatch(l, &["int", "uint", "double"]).ok_or(NO_OVERLOAD)? {
                Int(_) => Int(0),
                Uint(_) => Uint(0),
                _ => Double(0.0),
            };
            for x in l.iter() {
                acc = super::stdlib::call(Func::Add, &[acc, x.clone()])?;
            }
            Ok(acc)
        }
        Func::Min | Func::Max => {
            dispatch(l, COMPARABLE_NAMES).ok_or(NO_OVERLOAD)?;
            let name = if f == Func::Min { "min" } else { "max" };
            let Some(mut best) = l.first() else {
                return Err(format!("{name} called on empty list"));
            };
            let prefer = if f == Func::Min {
                Ordering::Greater
            } else {
                Ordering::Less
            };
            for x in l.iter() {
                if !comparer(x) {
                    return no_overload();
                }
                if order(best, x) == Some(prefer) {
                    best = x;
                }
            }
            Ok(best.clone())
        }
        _ => sort_by_keys(&[a[0].clone(), a[0].clone()]),
    }
}

/// `Slice`.
fn slice(a: &[Value]) -> EvalResult {
    use Value::*;
    let (List(l), Int(s), Int(e)) = (&a[0], &a[1], &a[2]) else {
        return no_overload();
    };
    if *s < 0 || *e < 0 {
        return Err("cannot slice(start, end), negative indexes not supported".to_string());
    }
    if s > e {
        return Err(format!(
            "cannot slice({s}, {e}), start index must be less than or equal to end index"
        ));
    }
    // both are non-negative here
    match (usize::try_from(*s), usize::try_from(*e)) {
        (Ok(s), Ok(e)) if e <= l.len() => Ok(List(Arc::new(l[s..e].to_vec()))),
        _ => Err(format!(
            "cannot slice({s}, {e}), list is length {}",
            l.len()
        )),
    }
}

/// `Flatten`.
fn flatten(a: &[Value]) -> EvalResult {
    use Value::*;
    let List(l) = &a[0] else { return no_overload() };
    let depth = match a.get(1) {
        Some(Int(d)) => {
            if *d < 0 {
                return Err("level must be non-negative".into());
            }
            *d
        }
        _ => 1,
    };
    fn flat(l: &[Value], d: i64, out: &mut Vec<Value>) {
        for x in l {
            match x {
                Value::List(inner) if d > 0 => flat(inner, d - 1, out),
                _ => out.push(x.clone()),
            }
        }
    }
    let mut out = Vec::new();
    flat(l, depth, &mut out);
    Ok(List(Arc::new(out)))
}

/// `SortByKeys` (ext.Lists' `@sortByAssociatedKeys`, also `sort()`): the members in the order
/// of their keys, which must be comparable and all of the first key's type. Go's `sort.Slice`
/// sorts up to 12 members by insertion, which this copies; longer lists sort stably, which
/// differs only for keys that are equal and yet distinct (`0.0`, `-0.0`) or NaN.
fn sort_by_keys(a: &[Value]) -> EvalResult {
    use Value::*;
    let (List(l), List(keys)) = (&a[0], &a[1]) else {
        return no_overload();
    };
    if l.len() != keys.len() {
        return Err(format!(
            "@sortByAssociatedKeys() expected a list of the same size as the associated keys list, but got {} and {} elements respectively",
            l.len(),
            keys.len()
        ));
    }
    let Some(first) = keys.first() else {
        return Ok(a[0].clone());
    };
    if !comparer(first) {
        return Err("list elements must be comparable".into());
    }
    if keys.len() > 1 && keys.iter().any(|k| k.type_name() != first.type_name()) {
        return Err("list elements must have the same type".into());
    }
    let less = |i: usize, j: usize| order(&keys[i], &keys[j]) == Some(Ordering::Less);
    let mut idx: Vec<usize> = (0..l.len()).collect();
    if idx.len() <= 12 {
        for i in 1..idx.len() {
            let mut j = i;
            while j > 0 && less(idx[j], idx[j - 1]) {
                idx.swap(j, j - 1);
                j -= 1;
            }
        }
    } else {
        idx.sort_by(|&i, &j| order(&keys[i], &keys[j]).unwrap_or(Ordering::Equal));
    }
    Ok(List(Arc::new(
        idx.into_iter().map(|i| l[i].clone()).collect(),
    )))
}

pub(super) fn cost(f: Func, a: &[Value], result: &Value) -> u64 {
    use Value::*;
    let sz = |i: usize| a.get(i).map(size).unwrap_or(1);
    match f {
        Func::Slice | Func::ListsRange => list_alloc(1.0, size(result)),
        Func::Reverse => match &a[0] {
            List(_) => list_alloc(1.0, size(result)),
            _ => 1,
        },
        Func::Flatten => {
            let depth = match a.get(1) {
                Some(Int(d)) => *d as f64,
                _ => 1.0,
            };
            list_alloc(if depth < 0.0 { 1.0 } else { depth }, sz(0))
        }
        Func::Distinct | Func::Sort | Func::SortByKeys => {
            let l = if f == Func::SortByKeys { &a[1] } else { &a[0] };
            match l {
                List(l) if !l.is_empty() => {
                    let factor = match l[0] {
                        Str(_) | Bytes(_) => 2.1,
                        _ => 2.0,
                    };
                    let n = l.len() as u64;
                    list_alloc(factor, n * n)
                }
                _ => list_alloc(2.0, 0),
            }
        }
        Func::IndexOf
        | Func::LastIndexOf
        | Func::IsSorted
        | Func::Sum
        | Func::Min
        | Func::Max
        | Func::Includes => a.first().map(traversal).unwrap_or(0),
        _ => 1,
    }
}
