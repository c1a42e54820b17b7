//! The interpreter for compiled selectors, with a runtime cost counter enforcing the Kubernetes
//! limit that charges what cel-go's cost tracker observes (`interpreter/runtimecost.go` with the
//! Kubernetes `library.CostEstimator`), step by step.
use super::device::{RawDevice, device_value, raw_field};
use super::func::Func;
use super::fuse::{FIELD_COST, PROP_COST};
use super::lib::stdlib::{self, display, index, opt_select, select};
use super::lib::{self, regex};
use super::node::{Comp, DeviceProp, FieldMode, Node};
use super::value::{EvalResult, MapVal, Value, b, hashable, int_len, no_overload};
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
    /// Variables: a comprehension's accumulator may hold an error (cel-go's `all`/`exists`
    /// absorb it when a later element decides), and a `cel.bind` variable the failure of its
    /// initializer, which only a use of the variable raises.
    pub locals: Vec<EvalResult>,
    pub device: DeviceInput<'a>,
    /// The raw device's whole value, once something needed it.
    pub built: Option<Value>,
    pub cost: u64,
    /// The root of an attribute that cel-go resolves without observing it (a ternary's branch):
    /// its own unit is not charged. Null when there is none.
    pub skip_root: *const Node,
    /// A Go panic inside cel-go (hashing a key Go cannot hash): it ends the whole evaluation
    /// with this error, whatever would have absorbed an error, and charges nothing more.
    pub panic: Option<String>,
}

/// How the errors of Go panics that cel-go recovers begin.
const PANIC: &str = "internal error: ";

/// The Go panic cel-go's cost tracker raises for a call of `func` whose arguments `failed`
/// (by position): ext.Lists' trackers read their list or depth argument without checking it
/// is not an error.
fn tracker_panic(func: Func, failed: &[bool]) -> Option<String> {
    let arg = match func {
        Func::Distinct | Func::Sort => 0,
        Func::SortByKeys | Func::Flatten => 1,
        _ => return None,
    };
    failed
        .get(arg)
        .is_some_and(|f| *f)
        .then(|| format!("{PANIC}interface conversion: *types.Err is not a list or an int"))
}

impl Ctx<'_> {
    fn whole_device(&mut self) -> EvalResult {
        match self.device {
            DeviceInput::Value(v) => Ok(v.clone()),
            DeviceInput::Raw(r) => {
                if self.built.is_none() {
                    self.built = Some(device_value(
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
        if let Some(p) = &self.panic {
            return Err(p.clone());
        }
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

    /// Whether `r` is a Go panic, which it then records (see `panic`): the step that panicked
    /// is not charged.
    fn panicked(&mut self, r: &EvalResult) -> bool {
        match r {
            Err(e) if e.starts_with(PANIC) => {
                self.panic.get_or_insert_with(|| e.clone());
                true
            }
            _ => false,
        }
    }

    pub fn eval(&mut self, n: &Node) -> EvalResult {
        match n {
            Node::Const(v) => Ok(v.clone()),
            Node::Device => {
                self.charge_attr(n, 1)?;
                self.whole_device()
            }
            Node::DeviceProp(p) => self.device_prop(n, p),
            Node::DeviceField {
                capacity,
                domain,
                id,
                mode,
            } => self.device_field(n, *capacity, domain, id, *mode),
            Node::Local(s) => {
                self.charge_attr(n, 1)?;
                self.locals[*s].clone()
            }
            Node::Select {
                operand,
                field,
                test,
            } => self.selection(operand, field, *test),
            Node::OptSelect { operand, field } => self.opt_selection(operand, field),
            Node::And(a, bb) => self.and(a, bb),
            Node::OrOp(a, bb) => self.or(a, bb),
            Node::Cond(c, x, y) => self.cond(c, x, y),
            Node::Call { func, args } => self.eval_call(*func, args),
            Node::RegexCall { func, target, re } => {
                // cel-go's `matches` price (the Kubernetes estimator's for `find`/`findAll`): a
                // tenth of the string plus one, times a quarter of the pattern, rounded up. The
                // call cel-go plans for a literal pattern is not priced when its target failed.
                let v = self.eval(target)?;
                self.charge(regex::literal_cost(*func, &v, re))?;
                regex::call_literal(*func, v, re)
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
                if self.panicked(&r) {
                    return r;
                }
                self.charge(if folded(n) { 0 } else { 30 })?;
                r
            }
            Node::Bind { slot, init, body } => {
                let v = self.eval(init);
                self.locals[*slot] = v;
                self.eval(body)
            }
            Node::Comp(c) => self.comp(c),
            // a set lookup is no call to cel-go's cost tracker
            Node::InSet { needle, set } => {
                let x = self.eval(needle)?;
                let r = stdlib::in_set(set, &x);
                self.panicked(&r);
                r
            }
        }
    }

    /// `device.driver` / `device.allowMultipleAllocations` (see `fuse.rs`).
    fn device_prop(&mut self, n: &Node, p: &DeviceProp) -> EvalResult {
        self.charge_attr(n, PROP_COST)?;
        match (self.device, p) {
            (DeviceInput::Raw(r), DeviceProp::Driver) => Ok(Value::str(r.driver)),
            (DeviceInput::Raw(r), DeviceProp::AllowMultipleAllocations) => {
                b(r.allow_multiple_allocations)
            }
            (DeviceInput::Value(v), DeviceProp::Driver) => select(v, &Value::str("driver"), false),
            (DeviceInput::Value(v), DeviceProp::AllowMultipleAllocations) => {
                select(v, &Value::str("allowMultipleAllocations"), false)
            }
        }
    }

    /// An attribute or capacity read straight from the device (see `fuse.rs`).
    fn device_field(
        &mut self,
        n: &Node,
        capacity: bool,
        domain: &Arc<str>,
        id: &Arc<str>,
        mode: FieldMode,
    ) -> EvalResult {
        // a presence test does not charge the `device` reference (see `Node::Select`),
        // an optional selection charges its qualifier only when it finds the key (see
        // `Node::OptSelect`)
        let found = match self.device {
            DeviceInput::Raw(r) => raw_field(&r, capacity, domain, id)?,
            DeviceInput::Value(v) => {
                let map = select(
                    v,
                    &Value::str(if capacity { "capacity" } else { "attributes" }),
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

    /// A field selection or a presence test (`has`).
    fn selection(&mut self, operand: &Node, field: &Value, test: bool) -> EvalResult {
        self.selection_of(operand, field, test, false)
    }

    /// [`Ctx::selection`]; `branch`: the selection is a branch of `?:`, which cel-go resolves
    /// as an attribute of its own, without the step that reads a presence test on an optional
    /// value as a bool: the optional field itself is the branch's value.
    fn selection_of(
        &mut self,
        operand: &Node,
        field: &Value,
        test: bool,
        branch: bool,
    ) -> EvalResult {
        if test && !is_attr(operand) {
            return self.computed_presence(operand, field, branch);
        }
        let v = self.eval_operand(operand)?;
        // the qualifier; a presence test costs nothing of its own (the Kubernetes
        // environment turns `PresenceTestHasCost` off), which cel-go counts by dropping
        // the attribute's own unit
        if !test {
            self.charge(1)?;
        }
        select(&v, field, test)
    }

    /// `has()` of a field of a computed value: the value, then the qualifier (the relative
    /// attribute around the value is the presence test's own unit, which is dropped); on an
    /// optional, the qualifier only when it finds the field, as for `.?`.
    fn computed_presence(&mut self, operand: &Node, field: &Value, branch: bool) -> EvalResult {
        let v = self.eval(operand)?;
        let optional = matches!(v, Value::Optional(_));
        let r = select(&v, field, !(branch && optional));
        let found = matches!(r, Ok(Value::Bool(true) | Value::Optional(Some(_))));
        if !optional || found {
            self.charge(1)?;
        }
        r
    }

    /// An optional field selection (`.?`).
    fn opt_selection(&mut self, operand: &Node, field: &Value) -> EvalResult {
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

    /// `&&`, absorbing errors as cel-go does.
    fn and(&mut self, a: &Node, bb: &Node) -> EvalResult {
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

    /// `||`, absorbing errors as cel-go does.
    fn or(&mut self, a: &Node, bb: &Node) -> EvalResult {
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

    /// `c ? x : y`.
    fn cond(&mut self, c: &Node, x: &Node, y: &Node) -> EvalResult {
        let branch = match self.eval(c)? {
            Value::Bool(true) => x,
            Value::Bool(false) => y,
            _ => return no_overload(),
        };
        // cel-go's ternary resolves an attribute branch without the observation of the
        // attribute itself (its qualifiers are still charged); a presence test's and a
        // nested ternary's cost nothing anyway
        let unobserved = match branch {
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
        let r = match branch {
            Node::Select {
                operand,
                field,
                test: true,
            } => self.selection_of(operand, field, true, true),
            _ => self.eval(branch),
        };
        self.skip_root = saved;
        r
    }

    /// A comprehension: the macros, two-variable comprehensions and transforms.
    fn comp(&mut self, c: &Comp) -> EvalResult {
        let range = self.eval(&c.range)?;
        let init = self.eval(&c.init);
        self.locals[c.accu] = init;
        let items: Vec<(Value, Value)> = match &range {
            Value::List(l) => l
                .iter()
                .enumerate()
                .map(|(i, v)| {
                    if c.var2.is_some() {
                        (Value::Int(int_len(i)), v.clone())
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
            if let Some(p) = &self.panic {
                return Err(p.clone());
            }
            if self.exceeded() {
                return Err(COST_EXCEEDED.to_string());
            }
            self.locals[c.var1] = Ok(k);
            if let Some(v2) = c.var2 {
                self.locals[v2] = Ok(v);
            }
            let cond = self.eval(&c.cond)?;
            if let Value::Bool(false) = cond {
                break;
            }
            let step = self.eval(&c.step);
            self.locals[c.accu] = step;
        }
        self.eval(&c.result)
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
            // Go hashes every key into the map it builds
            hashable(&kv)?;
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
                // qualifiers of an empty optional are never resolved
                if let Value::Optional(None) = c {
                    return Ok(c);
                }
                let k = self.eval(&args[1]);
                // the qualifier: an attribute used as the index is charged as it is evaluated,
                // anything else costs 1 more; an optional one only when it finds a value
                let r = match k {
                    Ok(k) => lib::call(func, &[c, k]),
                    Err(e) => Err(e),
                };
                if self.panicked(&r) {
                    return r;
                }
                let found = func == Func::Index || matches!(r, Ok(Value::Optional(Some(_))));
                if found && !is_attr(&args[1]) {
                    self.charge(1)?;
                }
                return r;
            }
            _ => {}
        }
        self.call_args(func, args)
    }

    /// A call charged by its argument values (see [`Ctx::eval_call`]): unary and binary calls
    /// evaluate every argument, longer ones stop at the first failure.
    fn call_args(&mut self, func: Func, args: &[Node]) -> EvalResult {
        // planned as variadic (several arities behind one dynamic dispatch): see below
        let variadic = matches!(func, Func::IndexOf | Func::LastIndexOf | Func::Format);
        if args.len() <= 2 && !variadic {
            let mut vals = [const { Ok(Value::Null) }, const { Ok(Value::Null) }];
            for (v, a) in vals.iter_mut().zip(args) {
                *v = self.eval(a);
            }
            let n = args.len();
            if let Some(Err(e)) = vals[..n].iter().find(|v| v.is_err()) {
                let failed = [vals[0].is_err(), vals[1].is_err()];
                if let Some(p) = tracker_panic(func, &failed[..n]) {
                    let r = Err(p);
                    self.panicked(&r);
                    return r;
                }
                let e = e.clone();
                let placeholders = vals.map(|v| v.unwrap_or(Value::Null));
                self.charge(lib::cost(func, &placeholders[..n], &Value::Null))?;
                return Err(e);
            }
            let vals = vals.map(|v| v.expect("no argument failed"));
            let r = lib::call(func, &vals[..n]);
            if self.panicked(&r) {
                return r;
            }
            self.charge(lib::cost(
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
                        self.charge(lib::cost(func, &vals, &Value::Null))?;
                    }
                    return Err(e);
                }
            }
        }
        let r = lib::call(func, &vals);
        if self.panicked(&r) {
            return r;
        }
        self.charge(lib::cost(func, &vals, r.as_ref().unwrap_or(&Value::Null)))?;
        r
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

/// Whether cel-go's planner turns `n` into a constant (list and map literals of constants; see
/// `plan.rs`, which folds all but those whose building fails).
pub(super) fn folded(n: &Node) -> bool {
    match n {
        Node::Const(_) => true,
        Node::List { elems, .. } => elems.iter().all(folded),
        Node::Map { entries } => entries.iter().all(|(k, v, _)| folded(k) && folded(v)),
        _ => false,
    }
}
