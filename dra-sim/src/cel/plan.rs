//! What cel-go's planner computes once, when it builds the program: the Kubernetes base
//! environment turns `OptOptimize` on, and the regex libraries ask for their patterns to be
//! compiled there. A failure while planning is no runtime error but a failed compilation
//! (`program instantiation failed: ...`), so this runs as the last step of [`super::compile`]:
//!
//! - list and map literals of constants become constants (a map whose key Go cannot hash —
//!   bytes, semver — panics in cel-go's planner; the API server would answer with an internal
//!   error and never store the selector, so it is a compile error here);
//! - type conversions (`int`, `uint`, `double`, `string`, `bool`, `bytes`, `type`, `dyn`) of a
//!   constant are evaluated, and fail to compile when they fail;
//! - `x in [...]` over a literal list of constant scalars becomes a lookup in a Go map
//!   ([`Node::InSet`]): never an error from a member, but `x` of a type Go cannot hash fails;
//! - an index by a constant of another type than string, int, uint, bool or double is refused
//!   (`invalid qualifier type`);
//! - a constant pattern of `matches`, `find` or `findAll` is compiled (an invalid one fails).
//!
//! Nodes are planned children first, as cel-go does, so the first failure is the same one.
use super::eval::{Ctx, DeviceInput, folded};
use super::func::Func;
use super::lib;
use super::node::{Comp, Node};
use super::value::{EvalResult, Value};
use std::sync::Arc;

type Planned = Result<Node, String>;

fn failed(e: &str) -> String {
    format!("program instantiation failed: {e}")
}

/// Plans `n` (see the module docs).
pub fn plan(n: Node) -> Planned {
    let in_literal_list =
        matches!(&n, Node::Call { func: Func::In, args } if matches!(args[1], Node::List { .. }));
    let n = plan_children(n)?;
    match n {
        Node::List { .. } | Node::Map { .. } => fold_literal(n),
        Node::Call { func, args } => plan_call(func, args, in_literal_list),
        n => Ok(n),
    }
}

/// A node cel-go plans as a constant: its value, or the error computing it raised.
fn constant(n: &Node) -> Option<EvalResult> {
    match n {
        Node::Const(v) => Some(Ok(v.clone())),
        Node::List { .. } | Node::Map { .. } if folded(n) => {
            let mut ctx = Ctx {
                locals: Vec::new(),
                device: DeviceInput::Value(&Value::Null),
                built: None,
                cost: 0,
                skip_root: std::ptr::null(),
                panic: None,
            };
            Some(ctx.eval(n))
        }
        _ => None,
    }
}

/// A literal of constants built once. One whose building fails stays a literal: cel-go keeps
/// the error as the constant, raised (at no cost) by every evaluation; only Go's panic over an
/// unhashable key ends the planning.
fn fold_literal(n: Node) -> Planned {
    match constant(&n) {
        Some(Ok(v)) => Ok(Node::Const(v)),
        Some(Err(e)) if e.contains("unhashable") => Err(failed(&e)),
        _ => Ok(n),
    }
}

fn plan_call(func: Func, args: Vec<Node>, in_literal_list: bool) -> Planned {
    match func {
        _ if is_conversion(func) && args.len() == 1 => match constant(&args[0]) {
            Some(v) => v
                .and_then(|v| lib::call(func, &[v]))
                .map(Node::Const)
                .map_err(|e| failed(&e)),
            None => Ok(Node::Call { func, args }),
        },
        Func::Index | Func::OptIndex => {
            if let Some(k) = constant(&args[1]) {
                qualifier(k)?;
            }
            Ok(Node::Call { func, args })
        }
        Func::In if in_literal_list => in_set(args),
        Func::Matches | Func::Find | Func::FindAll => regex_constant(func, args),
        _ => Ok(Node::Call { func, args }),
    }
}

/// The constant index types cel-go's planner makes a qualifier of.
fn qualifier(k: EvalResult) -> Result<(), String> {
    match k {
        Ok(Value::Str(_) | Value::Int(_) | Value::Uint(_) | Value::Bool(_) | Value::Double(_)) => {
            Ok(())
        }
        Ok(v) => Err(failed(&format!(
            "invalid qualifier type: {}",
            v.go_type_name()
        ))),
        Err(_) => Err(failed("invalid qualifier type: *types.Err")),
    }
}

/// `x in [...]` over a literal list: a set lookup when every member is a constant scalar (not
/// bytes), `false` without evaluating `x` when the list is empty.
fn in_set(mut args: Vec<Node>) -> Planned {
    let set = match constant(&args[1]) {
        Some(Ok(Value::List(l))) => l,
        // cel-go reads the constant as a list: the error in its place panics
        Some(Err(e)) => return Err(failed(&e)),
        _ => {
            return Ok(Node::Call {
                func: Func::In,
                args,
            });
        }
    };
    if set.is_empty() {
        return Ok(Node::Const(Value::Bool(false)));
    }
    let scalar = |v: &Value| {
        matches!(
            v,
            Value::Bool(_) | Value::Int(_) | Value::Uint(_) | Value::Double(_) | Value::Str(_)
        )
    };
    if !set.iter().all(scalar) {
        return Ok(Node::Call {
            func: Func::In,
            args,
        });
    }
    let needle = Box::new(args.swap_remove(0));
    Ok(Node::InSet { needle, set })
}

/// A regex call whose pattern is a constant string: compiled now (a failure is a compile error),
/// and kept compiled where [`Node::RegexCall`] can hold it (no `findAll` limit).
fn regex_constant(func: Func, mut args: Vec<Node>) -> Planned {
    let Some(Ok(Value::Str(p))) = constant(&args[1]) else {
        return Ok(Node::Call { func, args });
    };
    let re =
        regex::Regex::new(&p).map_err(|e| failed(&format!("invalid matches argument: {e}")))?;
    if args.len() != 2 {
        return Ok(Node::Call { func, args });
    }
    args.truncate(1);
    let target = Box::new(args.swap_remove(0));
    Ok(Node::RegexCall {
        func,
        target,
        re: Arc::new(re),
    })
}

/// The type conversions (and `type`, `dyn`) cel-go's planner evaluates when their argument is a
/// constant.
pub(super) fn is_conversion(f: Func) -> bool {
    matches!(
        f,
        Func::ToInt
            | Func::ToUint
            | Func::ToDouble
            | Func::ToString
            | Func::ToBool
            | Func::ToBytes
            | Func::TypeOf
            | Func::Dyn
    )
}

fn plan_children(n: Node) -> Planned {
    let b = |x: Box<Node>| plan(*x).map(Box::new);
    let all = |v: Vec<Node>| v.into_iter().map(plan).collect::<Result<Vec<_>, _>>();
    Ok(match n {
        Node::Select {
            operand,
            field,
            test,
        } => Node::Select {
            operand: b(operand)?,
            field,
            test,
        },
        Node::OptSelect { operand, field } => Node::OptSelect {
            operand: b(operand)?,
            field,
        },
        Node::And(x, y) => Node::And(b(x)?, b(y)?),
        Node::OrOp(x, y) => Node::OrOp(b(x)?, b(y)?),
        Node::Cond(c, x, y) => Node::Cond(b(c)?, b(x)?, b(y)?),
        Node::Call { func, args } => Node::Call {
            func,
            args: all(args)?,
        },
        Node::List { elems, optional } => Node::List {
            elems: all(elems)?,
            optional,
        },
        Node::Map { entries } => Node::Map {
            entries: entries
                .into_iter()
                .map(|(k, v, o)| Ok((plan(k)?, plan(v)?, o)))
                .collect::<Result<_, String>>()?,
        },
        Node::Comp(c) => Node::Comp(Box::new(plan_comp(*c)?)),
        Node::Bind { slot, init, body } => Node::Bind {
            slot,
            init: b(init)?,
            body: b(body)?,
        },
        Node::RegexCall { func, target, re } => Node::RegexCall {
            func,
            target: b(target)?,
            re,
        },
        Node::InSet { needle, set } => Node::InSet {
            needle: b(needle)?,
            set,
        },
        n @ (Node::Const(_)
        | Node::Device
        | Node::Local(_)
        | Node::DeviceProp(_)
        | Node::DeviceField { .. }) => n,
    })
}

/// A comprehension's parts in cel-go's planning order: range, accumulator, condition, step,
/// result.
fn plan_comp(c: Comp) -> Result<Comp, String> {
    Ok(Comp {
        range: plan(c.range)?,
        init: plan(c.init)?,
        cond: plan(c.cond)?,
        step: plan(c.step)?,
        result: plan(c.result)?,
        ..c
    })
}
