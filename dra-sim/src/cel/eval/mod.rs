//! The interpreter for compiled selectors, with a runtime cost counter enforcing the Kubernetes
//! limit that charges what cel-go's cost tracker observes (`interpreter/runtimecost.go` with the
//! Kubernetes `library.CostEstimator`), step by step.
use super::compile::{AuthzPrice, DeviceProp, FieldMode, Func, Node};
use super::fuse::{FIELD_COST, PROP_COST};
use super::named_format;
use super::net::{Addr, Prefix};
use super::{RawDevice, raw_field};

use super::value::{BYTES_NOT_UTF8, EvalResult, MapVal, NO_OVERLOAD, Value, equals, num_cmp};
use std::cmp::Ordering;
use std::sync::Arc;

pub const COST_LIMIT: u64 = 1_000_000;
pub const COST_EXCEEDED: &str = "operation cancelled: actual cost limit exceeded";

/// The `device` a program runs against: a value built beforehand, or the ResourceSlice device
/// itself, whose attributes fused nodes read one at a time (the whole value is built only if the
/// program uses `device` some other way).
#[derive(Clone, Copy)]
pub enum DeviceInput<'a> {
    Value(&'a Value),
    Raw(RawDevice<'a>),
}

pub struct Ctx<'a> {
    pub locals: Vec<Value>,
    pub device: DeviceInput<'a>,
    /// The raw device's whole value, once something needed it.
    pub built: Option<Value>,
    pub cost: u64,
    /// The root of an attribute that cel-go resolves without observing it (a ternary's branch):
    /// its own unit is not charged. Null when there is none.
    pub skip_root: *const Node,
}

fn no_overload<T>() -> Result<T, String> {
    Err(NO_OVERLOAD.to_string())
}

fn b(v: bool) -> EvalResult {
    Ok(Value::Bool(v))
}

impl Ctx<'_> {
    fn whole_device(&mut self) -> EvalResult {
        match self.device {
            DeviceInput::Value(v) => Ok(v.clone()),
            DeviceInput::Raw(r) => {
                if self.built.is_none() {
                    self.built = Some(super::device_value(
                        r.driver,
                        r.attributes,
                        r.capacity,
                        r.allow_multiple_allocations,
                    )?);
                }
                Ok(self.built.clone().expect("just built"))
            }
        }
    }

    /// Charges the `units` of attribute node `n`, less its own unit where cel-go does not observe
    /// it (see `skip_root`).
    fn charge_attr(&mut self, n: &Node, units: u64) -> Result<(), String> {
        self.charge(units - u64::from(std::ptr::eq(n, self.skip_root)))
    }

    /// Adds `n` and checks the limit, as cel-go does after each step. cel-go aborts the whole
    /// evaluation there; an error here could be absorbed (`&&`, `||`, `@not_strictly_false`), so
    /// the cost stays where it first passed the limit and [`Ctx::exceeded`] decides the outcome.
    fn charge(&mut self, n: u64) -> Result<(), String> {
        if self.exceeded() {
            return Err(COST_EXCEEDED.to_string());
        }
        self.cost += n;
        if self.exceeded() {
            return Err(COST_EXCEEDED.to_string());
        }
        Ok(())
    }

    /// Whether the evaluation ran past the cost limit (it is then cel-go's `actual cost limit
    /// exceeded`, whatever the value computed).
    pub fn exceeded(&self) -> bool {
        self.cost > COST_LIMIT
    }

    pub fn eval(&mut self, n: &Node) -> EvalResult {
        match n {
            Node::Const(v) => Ok(v.clone()),
            Node::Device => {
                self.charge_attr(n, 1)?;
                self.whole_device()
            }
            Node::DeviceProp(p) => {
                self.charge_attr(n, PROP_COST)?;
                match (self.device, p) {
                    (DeviceInput::Raw(r), DeviceProp::Driver) => Ok(Value::str(r.driver)),
                    (DeviceInput::Raw(r), DeviceProp::AllowMultipleAllocations) => {
                        b(r.allow_multiple_allocations)
                    }
                    (DeviceInput::Value(v), DeviceProp::Driver) => {
                        select(v, &Value::str("driver"), false)
                    }
                    (DeviceInput::Value(v), DeviceProp::AllowMultipleAllocations) => {
                        select(v, &Value::str("allowMultipleAllocations"), false)
                    }
                }
            }
            Node::DeviceField {
                capacity,
                domain,
                id,
                mode,
            } => {
                // a presence test does not charge the `device` reference (see `Node::Select`),
                // an optional selection charges its qualifier only when it finds the key (see
                // `Node::OptSelect`)
                let found = match self.device {
                    DeviceInput::Raw(r) => raw_field(&r, *capacity, domain, id)?,
                    DeviceInput::Value(v) => {
                        let map = select(
                            v,
                            &Value::str(if *capacity { "capacity" } else { "attributes" }),
                            false,
                        )?;
                        match index(&map, &Value::Str(domain.clone()))? {
                            Value::Map(m) => m.get_str(id).cloned(),
                            _ => None,
                        }
                    }
                };
                self.charge_attr(
                    n,
                    match mode {
                        FieldMode::Get => FIELD_COST,
                        FieldMode::Has => FIELD_COST - 1,
                        FieldMode::Opt => FIELD_COST - u64::from(found.is_none()),
                    },
                )?;
                match (mode, found) {
                    (FieldMode::Get, Some(v)) => Ok(v),
                    (FieldMode::Get, None) => Err(format!("no such key: {id}")),
                    (FieldMode::Has, found) => b(found.is_some()),
                    (FieldMode::Opt, found) => Ok(Value::Optional(found.map(Arc::new))),
                }
            }
            Node::Local(s) => {
                self.charge_attr(n, 1)?;
                Ok(self.locals[*s].clone())
            }
            Node::Select {
                operand,
                field,
                test,
            } => {
                let v = self.eval_operand(operand)?;
                // the qualifier; a presence test costs nothing of its own (the Kubernetes
                // environment turns `PresenceTestHasCost` off), which cel-go counts by dropping
                // the attribute's own unit
                if !*test || !is_attr(operand) {
                    self.charge(1)?;
                }
                select(&v, field, *test)
            }
            Node::OptSelect { operand, field } => {
                // cel-go's cost tracker observes an optional qualifier only when it finds a value
                let v = self.eval_operand(operand)?;
                let r = match v {
                    Value::Optional(None) => Ok(Value::Optional(None)),
                    Value::Optional(Some(inner)) => opt_select(&inner, field),
                    v => opt_select(&v, field),
                };
                if let Ok(Value::Optional(Some(_))) = r {
                    self.charge(1)?;
                }
                r
            }
            Node::And(a, bb) => {
                let l = self.eval(a);
                if let Ok(Value::Bool(false)) = l {
                    return b(false);
                }
                let r = self.eval(bb);
                match (l, r) {
                    (_, Ok(Value::Bool(false))) => b(false),
                    (Ok(Value::Bool(true)), Ok(Value::Bool(true))) => b(true),
                    (Err(e), _) => Err(e),
                    (_, Err(e)) => Err(e),
                    _ => no_overload(),
                }
            }
            Node::OrOp(a, bb) => {
                let l = self.eval(a);
                if let Ok(Value::Bool(true)) = l {
                    return b(true);
                }
                let r = self.eval(bb);
                match (l, r) {
                    (_, Ok(Value::Bool(true))) => b(true),
                    (Ok(Value::Bool(false)), Ok(Value::Bool(false))) => b(false),
                    (Err(e), _) => Err(e),
                    (_, Err(e)) => Err(e),
                    _ => no_overload(),
                }
            }
            Node::Cond(c, x, y) => {
                let branch = match self.eval(c)? {
                    Value::Bool(true) => x,
                    Value::Bool(false) => y,
                    _ => return no_overload(),
                };
                // cel-go's ternary resolves an attribute branch without the observation of the
                // attribute itself (its qualifiers are still charged); a presence test's and a
                // nested ternary's cost nothing anyway
                let unobserved = match &**branch {
                    Node::Cond(..) | Node::Select { test: true, .. } => false,
                    Node::DeviceField { mode, .. } => *mode != FieldMode::Has,
                    n => is_attr(n),
                };
                let root = if unobserved {
                    spine_root(branch) as *const Node
                } else {
                    std::ptr::null()
                };
                let saved = std::mem::replace(&mut self.skip_root, root);
                let r = self.eval(branch);
                self.skip_root = saved;
                r
            }
            Node::Call { func, args } => self.eval_call(*func, args),
            Node::RegexCall { func, target, re } => {
                // cel-go's `matches` price (the Kubernetes estimator's for `find`/`findAll`): a
                // tenth of the string plus one, times a quarter of the pattern, rounded up. The
                // call cel-go plans for a literal pattern is not priced when its target failed.
                let v = self.eval(target)?;
                let len = if *func == Func::Matches {
                    size(&v)
                } else {
                    k8s_size(&v)
                };
                self.charge(match_cost(len, re.as_str().chars().count() as u64))?;
                let Value::Str(s) = v else {
                    return no_overload();
                };
                match func {
                    Func::Matches => b(re.is_match(&s)),
                    Func::Find => Ok(Value::str(re.find(&s).map(|m| m.as_str()).unwrap_or(""))),
                    _ => Ok(Value::List(Arc::new(
                        re.find_iter(&s).map(|m| Value::str(m.as_str())).collect(),
                    ))),
                }
            }
            // cel-go builds a literal of constants once, when planning: it costs nothing; any
            // other is charged once its members are evaluated, whether or not one failed
            Node::List { elems, optional } => {
                let r = self.eval_list(elems, optional);
                self.charge(if folded(n) { 0 } else { 10 })?;
                r
            }
            Node::Map { entries } => {
                let r = self.eval_map(entries);
                self.charge(if folded(n) { 0 } else { 30 })?;
                r
            }
            Node::Bind { slot, init, body } => {
                let v = self.eval(init)?;
                self.locals[*slot] = v;
                self.eval(body)
            }
            Node::Comp(c) => {
                let range = self.eval(&c.range)?;
                let init = self.eval(&c.init)?;
                self.locals[c.accu] = init;
                let items: Vec<(Value, Value)> = match &range {
                    Value::List(l) => l
                        .iter()
                        .enumerate()
                        .map(|(i, v)| {
                            if c.var2.is_some() {
                                (Value::Int(i as i64), v.clone())
                            } else {
                                (v.clone(), Value::Null)
                            }
                        })
                        .collect(),
                    Value::Map(m) => m
                        .entries
                        .iter()
                        .map(|(k, v)| (k.clone(), v.clone()))
                        .collect(),
                    _ => {
                        return Err(format!(
                            "got '{}', expected iterable type",
                            range.go_type_name()
                        ));
                    }
                };
                for (k, v) in items {
                    if self.exceeded() {
                        return Err(COST_EXCEEDED.to_string());
                    }
                    self.locals[c.var1] = k;
                    if let Some(v2) = c.var2 {
                        self.locals[v2] = v;
                    }
                    let cond = self.eval(&c.cond)?;
                    if let Value::Bool(false) = cond {
                        break;
                    }
                    let step = self.eval(&c.step)?;
                    self.locals[c.accu] = step;
                }
                self.eval(&c.result)
            }
        }
    }

    fn eval_list(&mut self, elems: &[Node], optional: &[bool]) -> EvalResult {
        let mut out = Vec::with_capacity(elems.len());
        for (e, opt) in elems.iter().zip(optional) {
            match (self.eval(e)?, opt) {
                (Value::Optional(None), true) => {}
                (Value::Optional(Some(x)), true) => out.push((*x).clone()),
                (_, true) => return no_overload(),
                (v, false) => out.push(v),
            }
        }
        Ok(Value::List(Arc::new(out)))
    }

    fn eval_map(&mut self, entries: &[(Node, Node, bool)]) -> EvalResult {
        let mut m = MapVal::default();
        for (k, v, opt) in entries {
            let kv = self.eval(k)?;
            let vv = match (self.eval(v)?, opt) {
                (Value::Optional(None), true) => continue,
                (Value::Optional(Some(x)), true) => (*x).clone(),
                (_, true) => return no_overload(),
                (vv, false) => vv,
            };
            if m.get(&kv).is_some() {
                return Err(format!("Failed with repeated key: {}", display(&kv)));
            }
            m.entries.push((kv, vv));
        }
        Ok(Value::Map(Arc::new(m)))
    }

    /// The operand of a selection or index. When it is not an attribute (a call, a literal),
    /// cel-go wraps it in a relative attribute that costs 1 once evaluated, error or not.
    fn eval_operand(&mut self, operand: &Node) -> EvalResult {
        let v = self.eval(operand);
        if !is_attr(operand) {
            self.charge_attr(operand, 1)?;
        }
        v
    }

    /// A call, charged as cel-go's cost tracker does once it has the arguments' values: a unary
    /// or binary call evaluates every argument even after an error and is charged with the
    /// failed ones counting as size 1; a longer call stops at the first failing argument and is
    /// charged only when that was the last. `or`/`orValue` are not calls there (they short-cut
    /// their right side) and cost nothing; conversions of constants are folded when planning.
    fn eval_call(&mut self, func: Func, args: &[Node]) -> EvalResult {
        match func {
            Func::NotStrictlyFalse => {
                let r = self.eval(&args[0]);
                self.charge(1)?;
                return match r {
                    Ok(Value::Bool(false)) => b(false),
                    _ => b(true),
                };
            }
            Func::Or | Func::OrValue => {
                let l = self.eval(&args[0])?;
                return match l {
                    Value::Optional(Some(v)) if func == Func::OrValue => Ok((*v).clone()),
                    Value::Optional(Some(_)) => Ok(l),
                    Value::Optional(None) => self.eval(&args[1]),
                    _ => no_overload(),
                };
            }
            Func::Index | Func::OptIndex => {
                let c = self.eval_operand(&args[0])?;
                let k = self.eval(&args[1]);
                // the qualifier: an attribute used as the index is charged as it is evaluated,
                // anything else costs 1 more; an optional one only when it finds a value
                let r = match k {
                    Ok(k) => self.call(func, &[c, k]),
                    Err(e) => Err(e),
                };
                let found = func == Func::Index || matches!(r, Ok(Value::Optional(Some(_))));
                if found && !is_attr(&args[1]) {
                    self.charge(1)?;
                }
                return r;
            }
            Func::In => {
                // a literal list of scalar constants becomes a set lookup when planned: no cost
                // (the compiler keeps list literals as `Node::List`, never as a constant)
                let set: Option<Vec<Value>> = match &args[1] {
                    Node::List { elems, .. } => elems
                        .iter()
                        .map(|e| match e {
                            Node::Const(v) if is_set_member(v) => Some(v.clone()),
                            _ => None,
                        })
                        .collect(),
                    _ => None,
                };
                if let Some(l) = set {
                    if l.is_empty() {
                        return b(false);
                    }
                    let x = self.eval(&args[0])?;
                    return self.call(func, &[x, Value::List(Arc::new(l))]);
                }
            }
            _ if is_conversion(func) && folded(&args[0]) => {
                let x = self.eval(&args[0])?;
                return self.call(func, &[x]);
            }
            _ => {}
        }
        // planned as variadic (several arities behind one dynamic dispatch): see below
        let variadic = matches!(func, Func::IndexOf | Func::LastIndexOf | Func::Format);
        if args.len() <= 2 && !variadic {
            let mut vals = [const { Ok(Value::Null) }, const { Ok(Value::Null) }];
            for (v, a) in vals.iter_mut().zip(args) {
                *v = self.eval(a);
            }
            let n = args.len();
            if let Some(Err(e)) = vals[..n].iter().find(|v| v.is_err()) {
                let e = e.clone();
                let placeholders = vals.map(|v| v.unwrap_or(Value::Null));
                self.charge(call_cost(func, &placeholders[..n], &Value::Null))?;
                return Err(e);
            }
            let vals = vals.map(|v| v.expect("no argument failed"));
            let r = self.call(func, &vals[..n]);
            self.charge(call_cost(
                func,
                &vals[..n],
                r.as_ref().unwrap_or(&Value::Null),
            ))?;
            return r;
        }
        let mut vals = Vec::with_capacity(args.len());
        for (i, a) in args.iter().enumerate() {
            match self.eval(a) {
                Ok(v) => vals.push(v),
                Err(e) => {
                    if i + 1 == args.len() {
                        vals.push(Value::Null);
                        self.charge(call_cost(func, &vals, &Value::Null))?;
                    }
                    return Err(e);
                }
            }
        }
        let r = self.call(func, &vals);
        self.charge(call_cost(func, &vals, r.as_ref().unwrap_or(&Value::Null)))?;
        r
    }

    fn call(&mut self, f: Func, a: &[Value]) -> EvalResult {
        use Value::*;
        match f {
            Func::Add => match (&a[0], &a[1]) {
                (Int(x), Int(y)) => x
                    .checked_add(*y)
                    .map(Int)
                    .ok_or_else(|| "integer overflow".into()),
                (Uint(x), Uint(y)) => x
                    .checked_add(*y)
                    .map(Uint)
                    .ok_or_else(|| "unsigned integer overflow".into()),
                (Double(x), Double(y)) => Ok(Double(x + y)),
                (Str(x), Str(y)) => Ok(Value::str(&format!("{x}{y}"))),
                (Bytes(x), Bytes(y)) => Ok(Bytes(Arc::from([x.as_ref(), y.as_ref()].concat()))),
                (List(x), List(y)) => {
                    let mut v = (**x).clone();
                    v.extend(y.iter().cloned());
                    Ok(List(Arc::new(v)))
                }
                _ => no_overload(),
            },
            Func::Sub => match (&a[0], &a[1]) {
                (Int(x), Int(y)) => x
                    .checked_sub(*y)
                    .map(Int)
                    .ok_or_else(|| "integer overflow".into()),
                (Uint(x), Uint(y)) => x
                    .checked_sub(*y)
                    .map(Uint)
                    .ok_or_else(|| "unsigned integer overflow".into()),
                (Double(x), Double(y)) => Ok(Double(x - y)),
                _ => no_overload(),
            },
            Func::Mul => match (&a[0], &a[1]) {
                (Int(x), Int(y)) => x
                    .checked_mul(*y)
                    .map(Int)
                    .ok_or_else(|| "integer overflow".into()),
                (Uint(x), Uint(y)) => x
                    .checked_mul(*y)
                    .map(Uint)
                    .ok_or_else(|| "unsigned integer overflow".into()),
                (Double(x), Double(y)) => Ok(Double(x * y)),
                _ => no_overload(),
            },
            Func::Div => match (&a[0], &a[1]) {
                (Int(_), Int(0)) | (Uint(_), Uint(0)) => Err("division by zero".into()),
                (Int(x), Int(y)) => x
                    .checked_div(*y)
                    .map(Int)
                    .ok_or_else(|| "integer overflow".into()),
                (Uint(x), Uint(y)) => Ok(Uint(x / y)),
                (Double(x), Double(y)) => Ok(Double(x / y)),
                _ => no_overload(),
            },
            Func::Mod => match (&a[0], &a[1]) {
                (Int(_), Int(0)) | (Uint(_), Uint(0)) => Err("modulus by zero".into()),
                (Int(x), Int(y)) => x
                    .checked_rem(*y)
                    .map(Int)
                    .ok_or_else(|| "integer overflow".into()),
                (Uint(x), Uint(y)) => Ok(Uint(x % y)),
                _ => no_overload(),
            },
            Func::Neg => match &a[0] {
                Int(x) => x
                    .checked_neg()
                    .map(Int)
                    .ok_or_else(|| "integer overflow".into()),
                Double(x) => Ok(Double(-x)),
                _ => no_overload(),
            },
            Func::Not => match &a[0] {
                Bool(x) => b(!x),
                _ => no_overload(),
            },
            Func::Eq => b(equals(&a[0], &a[1])?),
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
            Func::Quote => {
                let Str(s) = &a[0] else { return no_overload() };
                Ok(Value::str(&quote(s)))
            }
            Func::Format => {
                let (Str(s), List(l)) = (&a[0], &a[1]) else {
                    return no_overload();
                };
                super::format::format(s, l).map(|s| Value::str(&s))
            }
            Func::MapInsert | Func::MapMerge => {
                let Map(m) = &a[0] else { return no_overload() };
                let add: Vec<(Value, Value)> = if f == Func::MapInsert {
                    vec![(a[1].clone(), a[2].clone())]
                } else {
                    let Map(n) = &a[1] else { return no_overload() };
                    n.entries.clone()
                };
                let mut out = MapVal {
                    entries: m.entries.clone(),
                    default_empty: false,
                };
                for (k, v) in add {
                    check_key(&k)?;
                    if map_lookup(&out, &k).is_some() {
                        return Err(format!("insert failed: key {} already exists", display(&k)));
                    }
                    out.entries.push((k, v));
                }
                Ok(Map(Arc::new(out)))
            }
            Func::SortByKeys => {
                let (List(l), List(keys)) = (&a[0], &a[1]) else {
                    return no_overload();
                };
                let mut idx: Vec<usize> = (0..l.len()).collect();
                let mut err = None;
                idx.sort_by(|&i, &j| match compare(&keys[i], &keys[j]) {
                    Ok(Some(o)) => o,
                    Ok(None) | Err(_) => {
                        err.get_or_insert_with(|| {
                            "list elements must have the same type".to_string()
                        });
                        Ordering::Equal
                    }
                });
                if let Some(e) = err {
                    return Err(e);
                }
                Ok(List(Arc::new(
                    idx.into_iter().map(|i| l[i].clone()).collect(),
                )))
            }
            // cel-go's `!=` is "equality did not answer true": an error from a Kubernetes type's
            // equality (a different type behind `dyn`) makes it true, where `==` fails
            Func::Ne => b(!matches!(equals(&a[0], &a[1]), Ok(true))),
            Func::Lt | Func::Le | Func::Gt | Func::Ge => {
                let o = compare(&a[0], &a[1])?;
                b(match f {
                    Func::Lt => o == Some(Ordering::Less),
                    Func::Le => matches!(o, Some(Ordering::Less | Ordering::Equal)),
                    Func::Gt => o == Some(Ordering::Greater),
                    _ => matches!(o, Some(Ordering::Greater | Ordering::Equal)),
                })
            }
            Func::In => match &a[1] {
                List(l) => {
                    for x in l.iter() {
                        if equals(x, &a[0]).unwrap_or(false) {
                            return b(true);
                        }
                    }
                    b(false)
                }
                Map(m) => {
                    check_key(&a[0])?;
                    b(m.get(&a[0]).is_some())
                }
                _ => no_overload(),
            },
            Func::Index => index(&a[0], &a[1]),
            Func::OptIndex => match &a[0] {
                Optional(None) => Ok(Optional(None)),
                Optional(Some(inner)) => opt_index(inner, &a[1]),
                v => opt_index(v, &a[1]),
            },
            Func::NotStrictlyFalse => unreachable_ok(),
            Func::Size => match &a[0] {
                Str(s) => Ok(Int(s.chars().count() as i64)),
                Bytes(x) => Ok(Int(x.len() as i64)),
                List(l) => Ok(Int(l.len() as i64)),
                Map(m) => Ok(Int(m.entries.len() as i64)),
                _ => no_overload(),
            },
            Func::Contains | Func::StartsWith | Func::EndsWith => match (&a[0], &a[1]) {
                (Str(x), Str(y)) => b(match f {
                    Func::Contains => x.contains(y.as_ref()),
                    Func::StartsWith => x.starts_with(y.as_ref()),
                    _ => x.ends_with(y.as_ref()),
                }),
                _ => no_overload(),
            },
            Func::Matches | Func::Find | Func::FindAll => {
                let (Str(s), Str(p)) = (&a[0], &a[1]) else {
                    return no_overload();
                };
                let re =
                    regex::Regex::new(p).map_err(|e| format!("invalid matches argument: {e}"))?;
                match f {
                    Func::Matches => b(re.is_match(s)),
                    Func::Find => Ok(Value::str(re.find(s).map(|m| m.as_str()).unwrap_or(""))),
                    _ => {
                        let limit = match a.get(2) {
                            Some(Int(n)) if *n >= 0 => *n as usize,
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
            Func::ToInt => match &a[0] {
                Int(x) => Ok(Int(*x)),
                Uint(x) => i64::try_from(*x)
                    .map(Int)
                    .map_err(|_| "range error converting uint to int".into()),
                Double(x) => {
                    if x.is_nan() || *x <= -9.223372036854776e18 || *x >= 9.223372036854776e18 {
                        Err("range error converting double to int".into())
                    } else {
                        Ok(Int(x.trunc() as i64))
                    }
                }
                Str(s) => s
                    .parse::<i64>()
                    .map(Int)
                    .map_err(|_| format!("cannot convert '{s}' to int")),
                _ => no_overload(),
            },
            Func::ToUint => match &a[0] {
                Uint(x) => Ok(Uint(*x)),
                Int(x) => u64::try_from(*x)
                    .map(Uint)
                    .map_err(|_| "range error converting int to uint".into()),
                Double(x) => {
                    if x.is_nan() || *x < 0.0 || *x >= 1.8446744073709552e19 {
                        Err("range error converting double to uint".into())
                    } else {
                        Ok(Uint(x.trunc() as u64))
                    }
                }
                Str(s) => s
                    .parse::<u64>()
                    .map(Uint)
                    .map_err(|_| format!("cannot convert '{s}' to uint")),
                _ => no_overload(),
            },
            Func::ToDouble => match &a[0] {
                Double(x) => Ok(Double(*x)),
                Int(x) => Ok(Double(*x as f64)),
                Uint(x) => Ok(Double(*x as f64)),
                Str(s) => s
                    .parse::<f64>()
                    .map(Double)
                    .map_err(|_| format!("cannot convert '{s}' to double")),
                _ => no_overload(),
            },
            Func::ToString => match &a[0] {
                Str(s) => Ok(Str(s.clone())),
                Int(x) => Ok(Value::str(&x.to_string())),
                Uint(x) => Ok(Value::str(&x.to_string())),
                Double(x) => Ok(Value::str(&fmt_double(*x))),
                Bool(x) => Ok(Value::str(if *x { "true" } else { "false" })),
                Bytes(x) => std::str::from_utf8(x)
                    .map(Value::str)
                    .map_err(|_| BYTES_NOT_UTF8.into()),
                Ip(x) => Ok(Value::str(&x.to_string())),
                Cidr(p) => Ok(Value::str(&p.to_string())),
                _ => no_overload(),
            },
            Func::ToBool => match &a[0] {
                Bool(x) => b(*x),
                Str(s) => match s.as_ref() {
                    "1" | "t" | "T" | "true" | "TRUE" | "True" => b(true),
                    "0" | "f" | "F" | "false" | "FALSE" | "False" => b(false),
                    _ => Err("type conversion error from 'string' to 'bool'".to_string()),
                },
                _ => no_overload(),
            },
            Func::TypeOf => Ok(Type(a[0].type_name())),
            Func::Dyn => Ok(a[0].clone()),
            Func::Quantity => match &a[0] {
                Str(s) => super::quantity::Quantity::parse(s).map(Quantity),
                _ => no_overload(),
            },
            Func::IsQuantity => match &a[0] {
                Str(s) => b(super::quantity::Quantity::parse(s).is_ok()),
                _ => no_overload(),
            },
            Func::QIsInteger => match &a[0] {
                Quantity(q) => b(q.as_i64().is_some()),
                _ => no_overload(),
            },
            Func::QAsInteger => match &a[0] {
                Quantity(q) => q
                    .as_i64()
                    .map(Int)
                    .ok_or_else(|| "cannot convert value to integer".into()),
                _ => no_overload(),
            },
            Func::QAsApproximateFloat => match &a[0] {
                Quantity(q) => Ok(Double(q.as_f64())),
                _ => no_overload(),
            },
            Func::QSign => match &a[0] {
                Quantity(q) => Ok(Int(q.sign())),
                _ => no_overload(),
            },
            Func::QAdd | Func::QSub => {
                let Quantity(q) = &a[0] else {
                    return no_overload();
                };
                let o = match &a[1] {
                    Quantity(o) => *o,
                    Int(i) => super::quantity::Quantity::from_i64(*i),
                    _ => return no_overload(),
                };
                let r = if f == Func::QAdd {
                    q.add(&o)?
                } else {
                    q.sub(&o)?
                };
                Ok(Quantity(r))
            }
            Func::IsGreaterThan | Func::IsLessThan | Func::CompareTo => {
                let o = match (&a[0], &a[1]) {
                    (Quantity(x), Quantity(y)) => x.cmp_q(y),
                    (Semver(x), Semver(y)) => x.compare(y),
                    _ => return no_overload(),
                };
                Ok(match f {
                    Func::IsGreaterThan => Bool(o == Ordering::Greater),
                    Func::IsLessThan => Bool(o == Ordering::Less),
                    _ => Int(o as i64),
                })
            }
            Func::Semver | Func::IsSemver => {
                let Str(s) = &a[0] else { return no_overload() };
                let norm = match a.get(1) {
                    None => false,
                    Some(Bool(x)) => *x,
                    Some(_) => return no_overload(),
                };
                let r = if norm {
                    super::semver::Semver::parse_normalized(s)
                } else {
                    super::semver::Semver::parse(s)
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
                Ok(Int(x as i64))
            }
            // No value of an authz type exists (the environment has no `authorizer`): a call
            // that type-checked through a `dyn` receiver finds no overload, as in cel-go.
            Func::Authz(_) => no_overload(),
            _ => self.call_ext(f, a),
        }
    }

    fn call_ext(&mut self, f: Func, a: &[Value]) -> EvalResult {
        use Value::*;
        match f {
            Func::CharAt => {
                let (Str(s), Int(i)) = (&a[0], &a[1]) else {
                    return no_overload();
                };
                let n = s.chars().count() as i64;
                if *i < 0 || *i > n {
                    return Err(format!("index out of range: {i}"));
                }
                Ok(Value::str(
                    &s.chars()
                        .nth(*i as usize)
                        .map(|c| c.to_string())
                        .unwrap_or_default(),
                ))
            }
            Func::IndexOf | Func::LastIndexOf => match &a[0] {
                Str(s) => {
                    let Str(sub) = &a[1] else {
                        return no_overload();
                    };
                    let chars: Vec<char> = s.chars().collect();
                    let subc: Vec<char> = sub.chars().collect();
                    let last = f == Func::LastIndexOf;
                    let start = match a.get(2) {
                        Some(Int(i)) => {
                            if *i < 0 || *i as usize > chars.len() {
                                return Err(format!("index out of range: {i}"));
                            }
                            Some(*i as usize)
                        }
                        Some(_) => return no_overload(),
                        None => None,
                    };
                    if subc.is_empty() {
                        return Ok(Int(
                            start.unwrap_or(if last { chars.len() } else { 0 }) as i64
                        ));
                    }
                    if subc.len() > chars.len() {
                        return Ok(Int(-1));
                    }
                    let found = if !last {
                        (start.unwrap_or(0)..=chars.len() - subc.len())
                            .find(|&i| chars[i..i + subc.len()] == subc[..])
                    } else {
                        let hi = start.unwrap_or(chars.len()).min(chars.len() - subc.len());
                        (0..=hi)
                            .rev()
                            .find(|&i| chars[i..i + subc.len()] == subc[..])
                    };
                    Ok(Int(found.map(|i| i as i64).unwrap_or(-1)))
                }
                List(l) => {
                    let mut it: Box<dyn Iterator<Item = (usize, &Value)>> = if f == Func::IndexOf {
                        Box::new(l.iter().enumerate())
                    } else {
                        Box::new(l.iter().enumerate().rev())
                    };
                    Ok(Int(it
                        .find(|(_, x)| equals(x, &a[1]).unwrap_or(false))
                        .map(|(i, _)| i as i64)
                        .unwrap_or(-1)))
                }
                _ => no_overload(),
            },
            Func::LowerAscii | Func::UpperAscii | Func::Trim => {
                let Str(s) = &a[0] else { return no_overload() };
                Ok(Value::str(&match f {
                    Func::LowerAscii => s.to_ascii_lowercase(),
                    Func::UpperAscii => s.to_ascii_uppercase(),
                    _ => s.trim().to_string(),
                }))
            }
            Func::Replace => {
                let (Str(s), Str(from), Str(to)) = (&a[0], &a[1], &a[2]) else {
                    return no_overload();
                };
                let n = match a.get(3) {
                    Some(Int(n)) => *n,
                    _ => -1,
                };
                Ok(Value::str(&if n < 0 {
                    s.replace(from.as_ref(), to)
                } else {
                    s.replacen(from.as_ref(), to, n as usize)
                }))
            }
            Func::Split => {
                let (Str(s), Str(sep)) = (&a[0], &a[1]) else {
                    return no_overload();
                };
                let n = match a.get(2) {
                    Some(Int(n)) => *n,
                    _ => -1,
                };
                if n == 0 {
                    return Ok(List(Arc::new(vec![])));
                }
                let parts: Vec<Value> = if sep.is_empty() {
                    let cs: Vec<String> = s.chars().map(|c| c.to_string()).collect();
                    if n > 0 && (n as usize) < cs.len() {
                        let mut v: Vec<Value> =
                            cs[..n as usize - 1].iter().map(|c| Value::str(c)).collect();
                        v.push(Value::str(&cs[n as usize - 1..].concat()));
                        v
                    } else {
                        cs.iter().map(|c| Value::str(c)).collect()
                    }
                } else if n < 0 {
                    s.split(sep.as_ref()).map(Value::str).collect()
                } else {
                    s.splitn(n as usize, sep.as_ref()).map(Value::str).collect()
                };
                Ok(List(Arc::new(parts)))
            }
            Func::Substring => {
                let (Str(s), Int(i)) = (&a[0], &a[1]) else {
                    return no_overload();
                };
                let chars: Vec<char> = s.chars().collect();
                let n = chars.len() as i64;
                let j = match a.get(2) {
                    Some(Int(j)) => *j,
                    _ => n,
                };
                if *i < 0 || *i > n {
                    return Err(format!("index out of range: {i}"));
                }
                if j < 0 || j > n {
                    return Err(format!("index out of range: {j}"));
                }
                if *i > j {
                    return Err(format!("invalid substring range. start: {i}, end: {j}"));
                }
                Ok(Value::str(
                    &chars[*i as usize..j as usize].iter().collect::<String>(),
                ))
            }
            Func::Join => {
                let List(l) = &a[0] else { return no_overload() };
                let sep = match a.get(1) {
                    Some(Str(s)) => s.to_string(),
                    _ => String::new(),
                };
                let mut parts = Vec::new();
                for x in l.iter() {
                    let Str(s) = x else { return no_overload() };
                    parts.push(s.to_string());
                }
                Ok(Value::str(&parts.join(&sep)))
            }
            Func::Reverse => match &a[0] {
                Str(s) => Ok(Value::str(&s.chars().rev().collect::<String>())),
                List(l) => Ok(List(Arc::new(l.iter().rev().cloned().collect()))),
                _ => no_overload(),
            },
            Func::IsSorted | Func::Sum | Func::Min | Func::Max | Func::Sort => {
                let List(l) = &a[0] else { return no_overload() };
                match f {
                    Func::IsSorted => {
                        for w in l.windows(2) {
                            if compare(&w[0], &w[1])?.ok_or(NO_OVERLOAD)? == Ordering::Greater {
                                return b(false);
                            }
                        }
                        b(true)
                    }
                    Func::Sum => {
                        let mut acc = match l.first() {
                            None => return Ok(Int(0)),
                            Some(v) => v.clone(),
                        };
                        for x in &l[1..] {
                            acc = self.call(Func::Add, &[acc, x.clone()])?;
                        }
                        Ok(acc)
                    }
                    Func::Min | Func::Max => {
                        let Some(mut best) = l.first().cloned() else {
                            return Err(format!(
                                "{}(list) argument must not be empty",
                                if f == Func::Min { "min" } else { "max" }
                            ));
                        };
                        for x in &l[1..] {
                            let o = compare(x, &best)?.ok_or(NO_OVERLOAD)?;
                            if (f == Func::Min && o == Ordering::Less)
                                || (f == Func::Max && o == Ordering::Greater)
                            {
                                best = x.clone();
                            }
                        }
                        Ok(best)
                    }
                    _ => {
                        let mut v = (**l).clone();
                        let mut err = None;
                        v.sort_by(|x, y| match compare(x, y) {
                            Ok(Some(o)) => o,
                            _ => {
                                err = Some("list elements must have the same type".to_string());
                                Ordering::Equal
                            }
                        });
                        if let Some(e) = err {
                            return Err(e);
                        }
                        Ok(List(Arc::new(v)))
                    }
                }
            }
            Func::Slice => {
                let (List(l), Int(s), Int(e)) = (&a[0], &a[1], &a[2]) else {
                    return no_overload();
                };
                let n = l.len() as i64;
                if *s < 0 || *e < 0 {
                    return Err(
                        "cannot slice(start, end), negative indexes not supported".to_string()
                    );
                }
                if s > e {
                    return Err(format!(
                        "cannot slice({s}, {e}), start index must be less than or equal to end index"
                    ));
                }
                if *e > n {
                    return Err(format!("cannot slice({s}, {e}), list is length {n}"));
                }
                Ok(List(Arc::new(l[*s as usize..*e as usize].to_vec())))
            }
            Func::Flatten => {
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
            Func::SetsContains | Func::SetsEquivalent | Func::SetsIntersects => {
                let (List(x), List(y)) = (&a[0], &a[1]) else {
                    return no_overload();
                };
                let has = |l: &[Value], v: &Value| l.iter().any(|e| equals(e, v).unwrap_or(false));
                b(match f {
                    Func::SetsContains => y.iter().all(|v| has(x, v)),
                    Func::SetsEquivalent => {
                        y.iter().all(|v| has(x, v)) && x.iter().all(|v| has(y, v))
                    }
                    _ => y.iter().any(|v| has(x, v)),
                })
            }
            Func::OptionalOf => Ok(Optional(Some(Arc::new(a[0].clone())))),
            Func::OptionalNone => Ok(Optional(None)),
            Func::OptionalOfNonZero => {
                let zero = match &a[0] {
                    Null => true,
                    Bool(x) => !x,
                    Int(x) => *x == 0,
                    Uint(x) => *x == 0,
                    Double(x) => *x == 0.0,
                    Str(s) => s.is_empty(),
                    Bytes(x) => x.is_empty(),
                    List(l) => l.is_empty(),
                    Map(m) => m.entries.is_empty(),
                    _ => false,
                };
                Ok(Optional(if zero {
                    None
                } else {
                    Some(Arc::new(a[0].clone()))
                }))
            }
            Func::HasValue => match &a[0] {
                Optional(o) => b(o.is_some()),
                _ => no_overload(),
            },
            Func::OptValue => match &a[0] {
                Optional(Some(v)) => Ok((**v).clone()),
                Optional(None) => Err("optional.none() dereference".into()),
                _ => no_overload(),
            },
            Func::OrValue => match &a[0] {
                Optional(Some(v)) => Ok((**v).clone()),
                Optional(None) => Ok(a[1].clone()),
                _ => no_overload(),
            },
            Func::Or => match &a[0] {
                Optional(Some(_)) => Ok(a[0].clone()),
                Optional(None) => Ok(a[1].clone()),
                _ => no_overload(),
            },
            Func::FormatNamed => match &a[0] {
                Str(s) => Ok(Optional(
                    named_format::lookup(s).map(|f| Arc::new(Format(f))),
                )),
                _ => no_overload(),
            },
            Func::FormatOf(i) => Ok(Format(&named_format::FORMATS[usize::from(i)])),
            Func::FormatValidate => {
                let (Format(f), Str(s)) = (&a[0], &a[1]) else {
                    return no_overload();
                };
                let errs = f.validate(s);
                Ok(Optional((!errs.is_empty()).then(|| {
                    Arc::new(List(Arc::new(errs.iter().map(|m| Value::str(m)).collect())))
                })))
            }
            _ => self.call_net(f, a),
        }
    }

    /// The apiserver's IP, CIDR and URL libraries. A call already cost 1; parsing costs what
    /// upstream's `CostEstimator.CallCost` charges instead (a tenth per character, rounded up)
    /// when that is more.
    fn call_net(&mut self, f: Func, a: &[Value]) -> EvalResult {
        use Value::*;
        let str_arg = |i: usize| match a.get(i) {
            Some(Str(s)) => Ok(s.clone()),
            _ => no_overload(),
        };
        match f {
            Func::Ip | Func::IsIp | Func::IpIsCanonical => {
                let s = str_arg(0)?;
                let r = Addr::parse(&s);
                match f {
                    Func::Ip => r.map(|x| Ip(Arc::new(x))),
                    Func::IsIp => b(r.is_ok()),
                    _ => b(r?.to_string() == *s),
                }
            }
            Func::Cidr | Func::IsCidr => {
                let s = str_arg(0)?;
                let r = Prefix::parse(&s);
                if f == Func::IsCidr {
                    return b(r.is_ok());
                }
                r.map(|x| Cidr(Arc::new(x)))
            }
            Func::Url | Func::IsUrl => {
                let s = str_arg(0)?;
                if f == Func::IsUrl {
                    return b(super::url::Url::is_request_uri(&s));
                }
                super::url::Url::parse(&s).map(|x| Url(Arc::new(x)))
            }
            Func::IpFamily
            | Func::IpIsUnspecified
            | Func::IpIsLoopback
            | Func::IpIsLinkLocalMulticast
            | Func::IpIsLinkLocalUnicast
            | Func::IpIsGlobalUnicast => {
                let Ip(x) = &a[0] else { return no_overload() };
                match f {
                    Func::IpFamily => Ok(Int(x.family())),
                    Func::IpIsUnspecified => b(x.is_unspecified()),
                    Func::IpIsLoopback => b(x.is_loopback()),
                    Func::IpIsLinkLocalMulticast => b(x.is_link_local_multicast()),
                    Func::IpIsLinkLocalUnicast => b(x.is_link_local_unicast()),
                    _ => b(x.is_global_unicast()),
                }
            }
            Func::CidrContainsIp | Func::CidrContainsCidr => {
                let Cidr(p) = &a[0] else { return no_overload() };
                match (f, &a[1]) {
                    (Func::CidrContainsIp, Ip(x)) => b(p.contains_ip(x)),
                    // upstream drops the parse error here (it reaches a type check first)
                    (Func::CidrContainsIp, Str(s)) => match Addr::parse(s) {
                        Ok(x) => b(p.contains_ip(&x)),
                        Err(_) => no_overload(),
                    },
                    (Func::CidrContainsCidr, Cidr(o)) => b(p.contains_prefix(o)),
                    (Func::CidrContainsCidr, Str(s)) => b(p.contains_prefix(&Prefix::parse(s)?)),
                    _ => no_overload(),
                }
            }
            Func::CidrIp | Func::CidrMasked | Func::CidrPrefixLength => {
                let Cidr(p) = &a[0] else { return no_overload() };
                match f {
                    Func::CidrIp => Ok(Ip(Arc::new(p.addr))),
                    Func::CidrMasked => Ok(Cidr(Arc::new(p.masked()))),
                    _ => Ok(Int(i64::from(p.bits))),
                }
            }
            Func::UrlScheme
            | Func::UrlHost
            | Func::UrlHostname
            | Func::UrlPort
            | Func::UrlEscapedPath
            | Func::UrlQuery => {
                let Url(u) = &a[0] else { return no_overload() };
                Ok(match f {
                    Func::UrlScheme => Value::str(u.scheme()),
                    Func::UrlHost => Value::str(u.host()),
                    Func::UrlHostname => Value::str(u.hostname()),
                    Func::UrlPort => Value::str(u.port()),
                    Func::UrlEscapedPath => Value::str(&u.escaped_path()),
                    _ => Map(Arc::new(MapVal {
                        entries: u
                            .query()
                            .into_iter()
                            .map(|(k, v)| {
                                let l = v.iter().map(|x| Value::str(x)).collect();
                                (Value::str(&k), List(Arc::new(l)))
                            })
                            .collect(),
                        default_empty: false,
                    })),
                })
            }
            _ => no_overload(),
        }
    }
}

/// Whether cel-go plans `n` as an attribute (an identifier, a selection or index chain, a
/// ternary), which a selection or index extends at the cost of its qualifier alone.
fn is_attr(n: &Node) -> bool {
    match n {
        Node::Device
        | Node::DeviceProp(_)
        | Node::DeviceField { .. }
        | Node::Local(_)
        | Node::Select { .. }
        | Node::OptSelect { .. }
        | Node::Cond(..) => true,
        Node::Call { func, .. } => matches!(func, Func::Index | Func::OptIndex),
        _ => false,
    }
}

/// Where attribute `n`'s chain of selections and indexes starts.
fn spine_root(mut n: &Node) -> &Node {
    loop {
        match n {
            Node::Select { operand, .. } | Node::OptSelect { operand, .. } => n = operand,
            Node::Call {
                func: Func::Index | Func::OptIndex,
                args,
            } => n = &args[0],
            _ => return n,
        }
    }
}

/// Whether cel-go's planner turns `n` into a constant (`OptOptimize`: list and map literals of
/// constants, type conversions of constants).
fn folded(n: &Node) -> bool {
    match n {
        Node::Const(_) => true,
        Node::List { elems, .. } => elems.iter().all(folded),
        Node::Map { entries } => entries.iter().all(|(k, v, _)| folded(k) && folded(v)),
        Node::Call { func, args } => is_conversion(*func) && args.len() == 1 && folded(&args[0]),
        _ => false,
    }
}

/// The type conversions (and `type`, `dyn`) that cel-go's planner evaluates when their argument
/// is a constant.
fn is_conversion(f: Func) -> bool {
    matches!(
        f,
        Func::ToInt
            | Func::ToUint
            | Func::ToDouble
            | Func::ToString
            | Func::ToBool
            | Func::TypeOf
            | Func::Dyn
    )
}

/// A constant list member that lets cel-go plan `in` as a set lookup.
fn is_set_member(v: &Value) -> bool {
    matches!(
        v,
        Value::Bool(_) | Value::Int(_) | Value::Uint(_) | Value::Double(_) | Value::Str(_)
    )
}

/// cel-go's `actualSize`: the size of strings (in code points), bytes, lists and maps, an
/// optional's value's, 1 for anything else.
fn size(v: &Value) -> u64 {
    match v {
        Value::Str(s) => s.chars().count() as u64,
        Value::Bytes(x) => x.len() as u64,
        Value::List(l) => l.len() as u64,
        Value::Map(m) => m.entries.len() as u64,
        Value::Optional(Some(x)) => size(x),
        _ => 1,
    }
}

/// The Kubernetes estimator's size, which does not look into optionals.
fn k8s_size(v: &Value) -> u64 {
    match v {
        Value::Optional(_) => 1,
        v => size(v),
    }
}

/// `ceil(n * per / 10)`: the string traversal factor (0.1) times `per`.
fn tenths(n: u64, per: u64) -> u64 {
    (n * per).div_ceil(10)
}

/// The Kubernetes estimator's `traversalCost` (a tenth of each string's bytes, rounded down).
fn traversal(v: &Value) -> u64 {
    match v {
        Value::Str(s) => s.len() as u64 / 10,
        Value::Bytes(x) => x.len() as u64 / 10,
        Value::List(l) => l.iter().map(traversal).sum(),
        Value::Map(m) => m
            .entries
            .iter()
            .map(|(k, v)| traversal(k) + traversal(v))
            .sum(),
        _ => 1,
    }
}

/// The price of matching a string of `chars` code points against a regex of `regex` (cel-go's
/// `matches`, and the Kubernetes estimator's for `find`, `findAll` and the named formats'
/// `validate`): a tenth of the string plus one, times a quarter of the regex, each rounded up.
fn match_cost(chars: u64, regex: u64) -> u64 {
    tenths(chars + 1, 1) * regex.div_ceil(4)
}

/// An ext.Lists allocating call: 1 for the call, 10 for the list, `factor` per unit of `n`.
fn list_alloc(factor: f64, n: u64) -> u64 {
    11 + (n as f64 * factor) as u64
}

/// What cel-go's cost tracker charges for a call with these arguments and result (a failed
/// argument or result passed as `Null`): the Kubernetes library estimator's price where it has
/// one, then ext.Lists' and ext.Sets' trackers, then cel-go's own, else 1. A regex call with a
/// literal pattern (`Node::RegexCall`) is priced where it runs.
fn call_cost(f: Func, a: &[Value], result: &Value) -> u64 {
    use Value::*;
    let sz = |i: usize| a.get(i).map(size).unwrap_or(1);
    let k8s_sz = |i: usize| a.get(i).map(k8s_size).unwrap_or(1);
    match f {
        Func::Eq | Func::Ne => match &a[0] {
            Quantity(_) | Ip(_) | Cidr(_) | Url(_) | Semver(_) | Format(_) => 1,
            _ => tenths(sz(0).min(sz(1)), 1),
        },
        Func::Lt | Func::Le | Func::Gt | Func::Ge => match (&a[0], &a[1]) {
            (Str(_), Str(_)) | (Bytes(_), Bytes(_)) => tenths(sz(0).min(sz(1)), 1),
            _ => 1,
        },
        Func::Add => match (&a[0], &a[1]) {
            (Str(_), Str(_)) | (Bytes(_), Bytes(_)) => tenths(sz(0) + sz(1), 1),
            _ => 1,
        },
        Func::StartsWith | Func::EndsWith => tenths(sz(1), 1),
        Func::Contains => tenths(sz(0), 1) * tenths(sz(1), 1),
        Func::Matches | Func::Find | Func::FindAll => {
            let regex = if f == Func::Matches { sz(1) } else { k8s_sz(1) };
            let s = if f == Func::Matches { sz(0) } else { k8s_sz(0) };
            match_cost(s, regex)
        }
        Func::In => match &a[1] {
            List(_) => sz(1),
            _ => 1,
        },
        Func::Quote | Func::Format => tenths(sz(0), 1),
        Func::Ip | Func::IsIp | Func::Cidr | Func::IsCidr | Func::Url => tenths(k8s_sz(0), 1),
        Func::IpIsCanonical => tenths(k8s_sz(0), 2),
        Func::CidrContainsIp | Func::CidrContainsCidr => {
            let cidr = match &a[0] {
                Cidr(p) => p.byte_len(),
                _ => 1,
            };
            let mut cost = tenths(2 * cidr, 1);
            if f == Func::CidrContainsCidr {
                cost += tenths(cidr, 1) + 1;
            }
            if let Some(Str(_)) = a.get(1) {
                cost += tenths(sz(1), 1);
            }
            cost
        }
        Func::LowerAscii
        | Func::UpperAscii
        | Func::Substring
        | Func::Trim
        | Func::Quantity
        | Func::IsQuantity
        | Func::Semver
        | Func::IsSemver => tenths(k8s_sz(0), 1),
        Func::Replace | Func::Split => tenths(k8s_sz(0), 2),
        Func::Join => tenths(k8s_size(result), 2),
        Func::IndexOf
        | Func::LastIndexOf
        | Func::IsSorted
        | Func::Sum
        | Func::Min
        | Func::Max
        | Func::Includes => a.first().map(traversal).unwrap_or(0),
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
        Func::Authz(AuthzPrice::Check) => 350_000,
        // the estimator's selector price: a list (10), a tenth of the string, and per
        // requirement (one per two characters) a list and a struct (10 + 40), rounded up
        Func::Authz(AuthzPrice::Selector) if a.len() >= 2 => {
            let n = k8s_sz(1);
            10 + tenths(n, 1) + n.div_ceil(2) * 50
        }
        Func::SetsContains | Func::SetsIntersects => 1 + sz(0) * sz(1),
        // priced by the format's longest regex even when the string failed
        Func::FormatValidate => match &a[0] {
            Format(fm) => match_cost(k8s_sz(1), fm.max_regex_size),
            _ => 1,
        },
        Func::SetsEquivalent => 1 + 2 * sz(0) * sz(1),
        _ => 1,
    }
}

fn unreachable_ok() -> EvalResult {
    Ok(Value::Bool(true))
}

/// `strings.quote`: a double-quoted string with Go's letter escapes; everything else as is.
fn quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match super::format::go_escape(c) {
            Some(e) => out.push_str(e),
            None => out.push(c),
        }
    }
    out.push('"');
    out
}

fn fmt_double(x: f64) -> String {
    if x.is_finite() && x == x.trunc() && x.abs() < 1e21 {
        format!("{x:.0}")
    } else {
        format!("{x}")
    }
}

fn display(v: &Value) -> String {
    match v {
        Value::Str(s) => s.to_string(),
        Value::Int(i) => i.to_string(),
        Value::Uint(u) => u.to_string(),
        Value::Bool(x) => x.to_string(),
        _ => v.type_name().to_string(),
    }
}

fn compare(x: &Value, y: &Value) -> Result<Option<Ordering>, String> {
    use Value::*;
    if let Some(o) = num_cmp(x, y) {
        return Ok(Some(o));
    }
    Ok(Some(match (x, y) {
        (Str(p), Str(q)) => p.cmp(q),
        (Bytes(p), Bytes(q)) => p.cmp(q),
        (Bool(p), Bool(q)) => p.cmp(q),
        (Double(p), Double(q)) if p.is_nan() || q.is_nan() => return Ok(None),
        (Int(_) | Uint(_) | Double(_), Int(_) | Uint(_) | Double(_)) => return Ok(None),
        _ => return no_overload(),
    }))
}

fn check_key(k: &Value) -> Result<(), String> {
    match k {
        Value::Str(_) | Value::Int(_) | Value::Uint(_) | Value::Bool(_) => Ok(()),
        Value::Double(_) => Ok(()),
        _ => Err(format!("unsupported key type: {}", k.type_name())),
    }
}

fn map_lookup(m: &MapVal, key: &Value) -> Option<Value> {
    if let Some(v) = m.get(key) {
        return Some(v.clone());
    }
    if let Value::Double(d) = key {
        // numeric keys compare across types
        if d.fract() == 0.0 {
            return m.get(&Value::Int(*d as i64)).cloned();
        }
    }
    if m.default_empty {
        return Some(Value::empty_map());
    }
    None
}

fn select(v: &Value, field: &Value, test: bool) -> EvalResult {
    let Value::Str(f) = field else {
        return no_overload();
    };
    match v {
        Value::Device(d) => {
            if test {
                return Ok(Value::Bool(true));
            }
            match f.as_ref() {
                "driver" => Ok(d.driver.clone()),
                "attributes" => Ok(d.attributes.clone()),
                "capacity" => Ok(d.capacity.clone()),
                "allowMultipleAllocations" => Ok(Value::Bool(d.allow_multiple_allocations)),
                _ => Err(format!("no such key: {f}")),
            }
        }
        Value::Map(m) => {
            if test {
                return Ok(Value::Bool(m.get_str(f).is_some() || m.default_empty));
            }
            match m.get_str(f) {
                Some(x) => Ok(x.clone()),
                None if m.default_empty => Ok(Value::empty_map()),
                None => Err(format!("no such key: {f}")),
            }
        }
        // cel-go answers presence tests (`has`, `.?`) on other types with "absent"
        _ if test => Ok(Value::Bool(false)),
        _ => Err(format!(
            "type '{}' does not support field selection",
            v.type_name()
        )),
    }
}

fn opt_select(v: &Value, field: &Value) -> EvalResult {
    match select(v, field, true)? {
        Value::Bool(true) => Ok(Value::Optional(Some(Arc::new(select(v, field, false)?)))),
        _ => Ok(Value::Optional(None)),
    }
}

fn index(c: &Value, k: &Value) -> EvalResult {
    match c {
        Value::List(l) => {
            let i = match k {
                Value::Int(i) => *i,
                Value::Uint(u) => *u as i64,
                Value::Double(d) if d.fract() == 0.0 => *d as i64,
                Value::Double(_) => return Err(format!("unsupported index value {}", display(k))),
                _ => return no_overload(),
            };
            if i < 0 || i as usize >= l.len() {
                return Err(format!("index out of bounds: {i}"));
            }
            Ok(l[i as usize].clone())
        }
        Value::Map(m) => {
            check_key(k)?;
            map_lookup(m, k).ok_or_else(|| format!("no such key: {}", display(k)))
        }
        Value::Device(_) => match k {
            Value::Str(_) => select(c, k, false),
            _ => no_overload(),
        },
        _ => no_overload(),
    }
}

fn opt_index(c: &Value, k: &Value) -> EvalResult {
    match c {
        Value::List(l) => {
            let Value::Int(i) = k else {
                return no_overload();
            };
            Ok(Value::Optional(if *i >= 0 && (*i as usize) < l.len() {
                Some(Arc::new(l[*i as usize].clone()))
            } else {
                None
            }))
        }
        Value::Map(m) => Ok(Value::Optional(map_lookup(m, k).map(Arc::new))),
        _ => no_overload(),
    }
}
