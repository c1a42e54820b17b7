//! From the `cel` crate's parsed AST to our typed program: type checking with the DRA declarations
//! and library signatures, two-variable comprehensions and `cel.bind` (which the crate's parser
//! leaves as plain calls), and regex literal validation.
use super::types::Ty;
use super::value::Value;
use cel::IdedExpr;
use cel::common::ast::{CallExpr, EntryExpr, Expr, LiteralValue};
use std::sync::Arc;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Func {
    Add,
    Sub,
    Mul,
    Div,
    Mod,
    Neg,
    Not,
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
    In,
    Index,
    OptIndex,
    NotStrictlyFalse,
    Size,
    Contains,
    StartsWith,
    EndsWith,
    Matches,
    ToInt,
    ToUint,
    ToDouble,
    ToString,
    ToBool,
    TypeOf,
    Dyn,
    Quantity,
    IsQuantity,
    QIsInteger,
    QAsInteger,
    QAsApproximateFloat,
    QSign,
    QAdd,
    QSub,
    IsGreaterThan,
    IsLessThan,
    CompareTo,
    Semver,
    IsSemver,
    Major,
    Ip,
    IsIp,
    IpIsCanonical,
    IpFamily,
    IpIsUnspecified,
    IpIsLoopback,
    IpIsLinkLocalMulticast,
    IpIsLinkLocalUnicast,
    IpIsGlobalUnicast,
    Cidr,
    IsCidr,
    CidrContainsIp,
    CidrContainsCidr,
    CidrIp,
    CidrMasked,
    CidrPrefixLength,
    Url,
    IsUrl,
    UrlScheme,
    UrlHost,
    UrlHostname,
    UrlPort,
    UrlEscapedPath,
    UrlQuery,
    Minor,
    Patch,
    CharAt,
    IndexOf,
    LastIndexOf,
    LowerAscii,
    UpperAscii,
    Replace,
    Split,
    Substring,
    Trim,
    Join,
    Find,
    FindAll,
    IsSorted,
    Sum,
    Min,
    Max,
    Slice,
    Flatten,
    Distinct,
    ListsRange,
    Reverse,
    First,
    Last,
    Sort,
    SetsContains,
    SetsEquivalent,
    SetsIntersects,
    OptionalOf,
    OptionalNone,
    OptionalOfNonZero,
    HasValue,
    OptValue,
    OrValue,
    Or,
    Includes,
    Quote,
    Format,
    /// accumulator map + key + value (transformMap)
    MapInsert,
    /// accumulator map + map (transformMapEntry; duplicate keys are an error)
    MapMerge,
    /// list + its sort keys (the `sortBy` macro)
    SortByKeys,
    /// `format.named(string)`
    FormatNamed,
    /// `format.<name>()`: the named format at this index of `named_format::FORMATS`
    FormatOf(u8),
    /// `<format>.validate(string)`
    FormatValidate,
    /// any function of the authz library: only ever reached with a receiver of another type,
    /// but priced by the Kubernetes estimator all the same
    Authz(AuthzPrice),
}

/// What the Kubernetes cost estimator charges for an authz library call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AuthzPrice {
    /// `check`: 350,000
    Check,
    /// `fieldSelector` / `labelSelector`: by the selector string's length
    Selector,
    /// anything else: 1
    Unit,
}

impl AuthzPrice {
    fn of(name: &str) -> Self {
        match name {
            "check" => AuthzPrice::Check,
            "fieldSelector" | "labelSelector" => AuthzPrice::Selector,
            _ => AuthzPrice::Unit,
        }
    }
}

#[derive(Debug)]
pub enum Node {
    Const(Value),
    Device,
    Local(usize),
    Select {
        operand: Box<Node>,
        field: Value,
        test: bool,
    },
    OptSelect {
        operand: Box<Node>,
        field: Value,
    },
    And(Box<Node>, Box<Node>),
    OrOp(Box<Node>, Box<Node>),
    Cond(Box<Node>, Box<Node>, Box<Node>),
    Call {
        func: Func,
        args: Vec<Node>,
    },
    List {
        elems: Vec<Node>,
        optional: Vec<bool>,
    },
    Map {
        entries: Vec<(Node, Node, bool)>,
    },
    Comp(Box<Comp>),
    Bind {
        slot: usize,
        init: Box<Node>,
        body: Box<Node>,
    },
    /// Regex calls with a literal pattern keep the compiled regex.
    RegexCall {
        func: Func,
        target: Box<Node>,
        re: Arc<regex::Regex>,
    },
    /// `device.driver` / `device.allowMultipleAllocations`, read straight from the device
    /// (see `fuse.rs`).
    DeviceProp(DeviceProp),
    /// `device.attributes[domain].id` or `device.capacity[domain].id` in any of its spellings,
    /// read straight from the device (see `fuse.rs`).
    DeviceField {
        capacity: bool,
        domain: Arc<str>,
        id: Arc<str>,
        mode: FieldMode,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceProp {
    Driver,
    AllowMultipleAllocations,
}

/// What a fused field access answers: the value (`.id`, `[id]`), presence (`has(.id)`) or an
/// optional (`.?id`, `[?id]`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FieldMode {
    Get,
    Has,
    Opt,
}

#[derive(Debug)]
pub struct Comp {
    pub range: Node,
    pub var1: usize,
    pub var2: Option<usize>,
    pub accu: usize,
    pub init: Node,
    pub cond: Node,
    pub step: Node,
    pub result: Node,
}

struct TwoVars {
    v1: String,
    v2: String,
    range: Node,
    t1: Ty,
    t2: Ty,
}

pub struct Compiler<'a> {
    scopes: Vec<(String, usize, Ty)>,
    next_slot: usize,
    pub max_slots: usize,
    src: &'a cel::common::ast::SourceInfo,
    text: &'a str,
    /// Inside a `format` call: aggregate literals may be heterogeneous (upstream exempts them),
    /// and static types are kept for the format check.
    in_format: usize,
    format_types: std::collections::HashMap<u64, Ty>,
    /// Errors of upstream's AST validators, reported only when checking succeeded.
    invalid: Vec<(u64, String)>,
}

type R = Result<(Node, Ty), String>;

fn attr_map_ty() -> Ty {
    Ty::map(Ty::Str, Ty::map(Ty::Str, Ty::Any))
}
fn cap_map_ty() -> Ty {
    Ty::map(Ty::Str, Ty::map(Ty::Str, Ty::Quantity))
}

impl<'a> Compiler<'a> {
    pub fn new(src: &'a cel::common::ast::SourceInfo, text: &'a str) -> Self {
        Compiler {
            scopes: Vec::new(),
            next_slot: 0,
            max_slots: 0,
            src,
            text,
            in_format: 0,
            format_types: Default::default(),
            invalid: Vec::new(),
        }
    }

    /// A map literal's key or value type joined with the previous ones; a mismatch is the
    /// homogeneous-literal validator's error (every one, unlike lists), unless inside `format`.
    fn join_entry(&mut self, prev: Option<Ty>, t: Ty, id: u64) -> Ty {
        let Some(p) = prev else { return t };
        p.unify(&t).unwrap_or_else(|| {
            if self.in_format == 0 {
                self.invalid
                    .push((id, format!("expected type '{p}' but found '{t}'")));
            }
            Ty::Dyn
        })
    }

    /// The validators' errors, in source order (as cel-go lists them).
    pub fn validated(&self) -> Result<(), String> {
        if self.invalid.is_empty() {
            return Ok(());
        }
        let mut errs: Vec<(u32, String)> = self
            .invalid
            .iter()
            .map(|(id, m)| {
                let at = self.src.offset_for(*id).map_or(0, |(s, _)| s);
                (at, self.err(*id, m.clone()))
            })
            .collect();
        errs.sort_by_key(|e| e.0);
        Err(errs.into_iter().map(|e| e.1).collect::<Vec<_>>().join("\n"))
    }

    fn err(&self, id: u64, msg: String) -> String {
        let (line, col) = match self.src.offset_for(id) {
            Some((start, _)) => {
                let start = start as usize;
                let mut line = 1;
                let mut col = 1;
                // offsets are in bytes, columns in characters
                for (i, c) in self.text.char_indices() {
                    if i >= start {
                        break;
                    }
                    if c == '\n' {
                        line += 1;
                        col = 1;
                    } else {
                        col += 1;
                    }
                }
                (line, col)
            }
            None => (1, 1),
        };
        format!("ERROR: <input>:{line}:{col}: {msg}")
    }

    fn push(&mut self, name: &str, ty: Ty) -> usize {
        let slot = self.next_slot;
        self.next_slot += 1;
        self.max_slots = self.max_slots.max(self.next_slot);
        self.scopes.push((name.to_string(), slot, ty));
        slot
    }
    fn pop(&mut self, n: usize) {
        for _ in 0..n {
            self.scopes.pop();
            self.next_slot -= 1;
        }
    }

    pub fn compile(&mut self, e: &IdedExpr) -> R {
        let r = self.compile_expr(e)?;
        if self.in_format > 0 {
            self.format_types.insert(e.id, r.1.clone());
        }
        Ok(r)
    }

    fn compile_expr(&mut self, e: &IdedExpr) -> R {
        match &e.expr {
            Expr::Literal(l) => Ok(match l {
                LiteralValue::Boolean(b) => (Node::Const(Value::Bool(*b.inner())), Ty::Bool),
                LiteralValue::Int(i) => (Node::Const(Value::Int(*i.inner())), Ty::Int),
                LiteralValue::UInt(u) => (Node::Const(Value::Uint(*u.inner())), Ty::Uint),
                LiteralValue::Double(d) => (Node::Const(Value::Double(*d.inner())), Ty::Double),
                LiteralValue::String(s) => (Node::Const(Value::str(s.inner())), Ty::Str),
                LiteralValue::Bytes(b) => {
                    (Node::Const(Value::Bytes(Arc::from(b.inner()))), Ty::Bytes)
                }
                LiteralValue::Null => (Node::Const(Value::Null), Ty::Null),
            }),
            Expr::Ident(name) => {
                if let Some((_, slot, ty)) = self.scopes.iter().rev().find(|(n, _, _)| n == name) {
                    return Ok((Node::Local(*slot), ty.clone()));
                }
                match name.as_str() {
                    "device" => Ok((Node::Device, Ty::Device)),
                    "int" | "uint" | "double" | "string" | "bool" | "bytes" | "list" | "map"
                    | "null_type" | "type" => {
                        Ok((Node::Const(Value::Type(type_name_static(name))), Ty::Type))
                    }
                    _ => Err(self.err(
                        e.id,
                        format!("undeclared reference to '{name}' (in container '')"),
                    )),
                }
            }
            Expr::Select(sel) => {
                // `net.IP` / `net.CIDR`: the libraries' type names, unless `net` is a variable
                if let Expr::Ident(ns) = &sel.operand.expr
                    && ns == "net"
                    && !sel.test
                    && !self.scopes.iter().any(|(n, _, _)| n == ns)
                    && let Some(tn) = match sel.field.as_str() {
                        "IP" => Some("net.IP"),
                        "CIDR" => Some("net.CIDR"),
                        _ => None,
                    }
                {
                    return Ok((Node::Const(Value::Type(tn)), Ty::Type));
                }
                let (op, t) = self.compile(&sel.operand)?;
                let field = sel.field.as_str();
                let ty = match &t {
                    Ty::Device => match field {
                        "driver" => Ty::Str,
                        "attributes" => attr_map_ty(),
                        "capacity" => cap_map_ty(),
                        "allowMultipleAllocations" => Ty::Bool,
                        _ => return Err(self.err(e.id, format!("undefined field '{field}'"))),
                    },
                    Ty::Map(k, v) => {
                        if !k.accepts(&Ty::Str) {
                            return Err(self.err(
                                e.id,
                                format!("type '{t}' does not support field selection"),
                            ));
                        }
                        (**v).clone()
                    }
                    Ty::Dyn | Ty::Any => Ty::Dyn,
                    _ => {
                        return Err(
                            self.err(e.id, format!("type '{t}' does not support field selection"))
                        );
                    }
                };
                let ty = if sel.test { Ty::Bool } else { ty };
                Ok((
                    Node::Select {
                        operand: Box::new(op),
                        field: Value::str(field),
                        test: sel.test,
                    },
                    ty,
                ))
            }
            Expr::Call(call) => self.call(e.id, call),
            Expr::List(l) => {
                let mut elems = Vec::new();
                let mut optional = vec![false; l.elements.len()];
                let mut ety: Option<Ty> = None;
                let mut mismatched = false;
                for (i, el) in l.elements.iter().enumerate() {
                    let (n, mut t) = self.compile(el)?;
                    if l.optional_indices.contains(&i) {
                        optional[i] = true;
                        t = match t {
                            Ty::Opt(inner) => *inner,
                            t if t.is_dyn() => Ty::Dyn,
                            other => {
                                return Err(self.err(
                                    el.id,
                                    format!("expected type 'optional_type(T)' but found '{other}'"),
                                ));
                            }
                        };
                    }
                    ety = Some(match ety {
                        None => t,
                        Some(prev) => match prev.unify(&t) {
                            Some(u) => u,
                            None => {
                                // a validator's error; inside `format` upstream exempts it
                                if self.in_format == 0 && !mismatched {
                                    self.invalid.push((
                                        el.id,
                                        format!("expected type '{prev}' but found '{t}'"),
                                    ));
                                }
                                mismatched = true;
                                Ty::Dyn
                            }
                        },
                    });
                    elems.push(n);
                }
                Ok((
                    Node::List { elems, optional },
                    Ty::list(ety.unwrap_or(Ty::Dyn)),
                ))
            }
            Expr::Map(m) => {
                let mut entries = Vec::new();
                let mut kt: Option<Ty> = None;
                let mut vt: Option<Ty> = None;
                for entry in &m.entries {
                    let EntryExpr::MapEntry(me) = &entry.expr else {
                        return Err(
                            self.err(entry.id, "unsupported struct field in map literal".into())
                        );
                    };
                    let (kn, k) = self.compile(&me.key)?;
                    let (vn, mut v) = self.compile(&me.value)?;
                    if me.optional {
                        v = match v {
                            Ty::Opt(inner) => *inner,
                            t => t,
                        };
                    }
                    if !matches!(
                        k,
                        Ty::Str | Ty::Int | Ty::Uint | Ty::Bool | Ty::Dyn | Ty::Any
                    ) {
                        return Err(self.err(me.key.id, format!("unsupported map key type: {k}")));
                    }
                    kt = Some(self.join_entry(kt, k, me.key.id));
                    vt = Some(self.join_entry(vt, v, me.value.id));
                    entries.push((kn, vn, me.optional));
                }
                Ok((
                    Node::Map { entries },
                    Ty::map(kt.unwrap_or(Ty::Dyn), vt.unwrap_or(Ty::Dyn)),
                ))
            }
            Expr::Comprehension(c) => {
                let (range, rt) = self.compile(&c.iter_range)?;
                let (it1, it2) = iter_types(&rt, c.iter_var2.is_some())
                    .ok_or_else(|| self.err(c.iter_range.id, format!("expression of type '{rt}' cannot be range of a comprehension (must be list, map, or dynamic)")))?;
                let (init, at) = self.compile(&c.accu_init)?;
                let accu = self.push(&c.accu_var, at.clone());
                let var1 = self.push(&c.iter_var, it1);
                let var2 = c.iter_var2.as_ref().map(|v| self.push(v, it2.clone()));
                let (cond, _) = self.compile(&c.loop_cond)?;
                let (step, st) = self.compile(&c.loop_step)?;
                let n = if var2.is_some() { 2 } else { 1 };
                self.pop(n);
                // result sees only the accumulator
                let (result, rt2) = self.compile(&c.result)?;
                self.pop(1);
                let _ = st;
                let _ = at;
                Ok((
                    Node::Comp(Box::new(Comp {
                        range,
                        var1,
                        var2,
                        accu,
                        init,
                        cond,
                        step,
                        result,
                    })),
                    rt2,
                ))
            }
            Expr::Struct(_) => Err(self.err(
                e.id,
                "struct literals are not supported in this environment".into(),
            )),
            Expr::Unspecified => Err(self.err(e.id, "unspecified expression".into())),
        }
    }

    /// What every two-variable form starts with: the two names (simple identifiers), the
    /// compiled range, and the types the names take over it.
    fn two_vars(&mut self, target: &IdedExpr, args: &[IdedExpr]) -> Result<TwoVars, String> {
        let name = |e: &IdedExpr| match &e.expr {
            Expr::Ident(n) => Ok(n.clone()),
            _ => Err(self.err(e.id, "argument must be a simple name".into())),
        };
        let v1 = name(&args[0])?;
        let v2 = name(&args[1])?;
        let (range, rt) = self.compile(target)?;
        let (t1, t2) = iter_types(&rt, true).ok_or_else(|| {
            self.err(target.id, format!("expression of type '{rt}' cannot be range of a comprehension (must be list, map, or dynamic)"))
        })?;
        Ok(TwoVars {
            v1,
            v2,
            range,
            t1,
            t2,
        })
    }

    fn macro3(&mut self, id: u64, kind: &str, target: &IdedExpr, args: &[IdedExpr]) -> R {
        // two-variable comprehensions: all(k, v, p), exists(k, v, p), existsOne(k, v, p)
        let TwoVars {
            v1,
            v2,
            range,
            t1,
            t2,
        } = self.two_vars(target, args)?;
        let accu_ty = if kind == "existsOne" {
            Ty::Int
        } else {
            Ty::Bool
        };
        let accu = self.push("@result", accu_ty);
        let var1 = self.push(&v1, t1);
        let var2 = self.push(&v2, t2);
        let (pred, pt) = self.compile(&args[2])?;
        self.pop(3);
        if !Ty::Bool.accepts(&pt) {
            return Err(self.err(
                args[2].id,
                format!("found no matching overload for '_&&_' applied to '(bool, {pt})'"),
            ));
        }
        let acc = || Box::new(Node::Local(accu));
        let (init, cond, step, result) = match kind {
            "all" => (
                Node::Const(Value::Bool(true)),
                Node::Call {
                    func: Func::NotStrictlyFalse,
                    args: vec![Node::Local(accu)],
                },
                Node::And(acc(), Box::new(pred)),
                Node::Local(accu),
            ),
            "exists" => (
                Node::Const(Value::Bool(false)),
                Node::Call {
                    func: Func::NotStrictlyFalse,
                    args: vec![Node::Call {
                        func: Func::Not,
                        args: vec![Node::Local(accu)],
                    }],
                },
                Node::OrOp(acc(), Box::new(pred)),
                Node::Local(accu),
            ),
            _ => (
                Node::Const(Value::Int(0)),
                Node::Const(Value::Bool(true)),
                Node::Cond(
                    Box::new(pred),
                    Box::new(Node::Call {
                        func: Func::Add,
                        args: vec![Node::Local(accu), Node::Const(Value::Int(1))],
                    }),
                    acc(),
                ),
                Node::Call {
                    func: Func::Eq,
                    args: vec![Node::Local(accu), Node::Const(Value::Int(1))],
                },
            ),
        };
        let _ = id;
        Ok((
            Node::Comp(Box::new(Comp {
                range,
                var1,
                var2: Some(var2),
                accu,
                init,
                cond,
                step,
                result,
            })),
            Ty::Bool,
        ))
    }

    /// `ext.TwoVarComprehensions` transforms: `l.transformList(i, v, [filter,] expr)`,
    /// `m.transformMap(k, v, [filter,] expr)`, `m.transformMapEntry(k, v, [filter,] mapExpr)`.
    fn transform(&mut self, kind: &str, target: &IdedExpr, args: &[IdedExpr]) -> R {
        let TwoVars {
            v1,
            v2,
            range,
            t1,
            t2,
        } = self.two_vars(target, args)?;
        let accu = self.push("@result", Ty::Dyn);
        let var1 = self.push(&v1, t1.clone());
        let var2 = self.push(&v2, t2);
        let filter = if args.len() == 4 {
            match self.compile(&args[2]) {
                Ok((f, ft)) if Ty::Bool.accepts(&ft) => Some(f),
                Ok((_, ft)) => {
                    self.pop(3);
                    return Err(self.err(
                        args[2].id,
                        format!(
                            "found no matching overload for '_?_:_' applied to '({ft}, dyn, dyn)'"
                        ),
                    ));
                }
                Err(e) => {
                    self.pop(3);
                    return Err(e);
                }
            }
        } else {
            None
        };
        let body = self.compile(&args[args.len() - 1]);
        self.pop(3);
        let (body, bt) = body?;
        let acc = || Box::new(Node::Local(accu));
        let (init, step, rty) = match kind {
            "transformList" => (
                Node::List {
                    elems: vec![],
                    optional: vec![],
                },
                Node::Call {
                    func: Func::Add,
                    args: vec![
                        Node::Local(accu),
                        Node::List {
                            elems: vec![body],
                            optional: vec![false],
                        },
                    ],
                },
                Ty::List(Box::new(bt)),
            ),
            "transformMap" => (
                Node::Map { entries: vec![] },
                Node::Call {
                    func: Func::MapInsert,
                    args: vec![Node::Local(accu), Node::Local(var1), body],
                },
                Ty::map(t1, bt),
            ),
            _ => {
                let (k, v) = match bt {
                    Ty::Map(k, v) => (*k, *v),
                    x if x.is_dyn() => (Ty::Dyn, Ty::Dyn),
                    other => {
                        return Err(self.err(
                            args[args.len() - 1].id,
                            format!("found no matching overload for 'cel.@mapInsert' applied to '(map(dyn, dyn), {other})'"),
                        ));
                    }
                };
                (
                    Node::Map { entries: vec![] },
                    Node::Call {
                        func: Func::MapMerge,
                        args: vec![Node::Local(accu), body],
                    },
                    Ty::map(k, v),
                )
            }
        };
        let step = match filter {
            Some(f) => Node::Cond(Box::new(f), Box::new(step), acc()),
            None => step,
        };
        Ok((
            Node::Comp(Box::new(Comp {
                range,
                var1,
                var2: Some(var2),
                accu,
                init,
                cond: Node::Const(Value::Bool(true)),
                step,
                result: Node::Local(accu),
            })),
            rty,
        ))
    }

    /// The `ext.Lists` `sortBy(x, key)` macro: the keys are computed like `map(x, key)`, then
    /// the list is sorted (stably) by them.
    fn sort_by(&mut self, target: &IdedExpr, args: &[IdedExpr]) -> R {
        let Expr::Ident(v) = &args[0].expr else {
            return Err(self.err(
                args[0].id,
                "sortBy(var, ...) variable name must be a simple identifier".into(),
            ));
        };
        let (range, rt) = self.compile(target)?;
        let elem = match &rt {
            Ty::List(e) => (**e).clone(),
            x if x.is_dyn() => Ty::Dyn,
            other => {
                return Err(self.err(
                    target.id,
                    format!("found no matching overload for 'sortBy' applied to '{other}'"),
                ));
            }
        };
        let input = self.push("@__sortBy_input__", rt.clone());
        let accu = self.push("@result", Ty::Dyn);
        let var1 = self.push(v, elem);
        let key = self.compile(&args[1]);
        self.pop(2);
        let (key, _) = match key {
            Ok(k) => k,
            Err(e) => {
                self.pop(1);
                return Err(e);
            }
        };
        let keys = Node::Comp(Box::new(Comp {
            range: Node::Local(input),
            var1,
            var2: None,
            accu,
            init: Node::List {
                elems: vec![],
                optional: vec![],
            },
            cond: Node::Const(Value::Bool(true)),
            step: Node::Call {
                func: Func::Add,
                args: vec![
                    Node::Local(accu),
                    Node::List {
                        elems: vec![key],
                        optional: vec![false],
                    },
                ],
            },
            result: Node::Local(accu),
        }));
        self.pop(1);
        Ok((
            Node::Bind {
                slot: input,
                init: Box::new(range),
                body: Box::new(Node::Call {
                    func: Func::SortByKeys,
                    args: vec![Node::Local(input), keys],
                }),
            },
            rt,
        ))
    }

    fn call(&mut self, id: u64, call: &CallExpr) -> R {
        let fname = call.func_name.as_str();
        // namespaced globals: target is a plain identifier naming a namespace, not a variable
        let mut global = fname.to_string();
        let mut target = call.target.as_deref();
        if let Some(t) = target
            && let Expr::Ident(ns) = &t.expr
        {
            let is_var = ns == "device" || self.scopes.iter().any(|(n, _, _)| n == ns);
            if !is_var
                && matches!(
                    ns.as_str(),
                    "cel" | "sets" | "lists" | "optional" | "strings" | "math" | "ip"
                )
            {
                global = format!("{ns}.{fname}");
                target = None;
            }
            // The format library's functions are found by their full name before the target is
            // looked at (as cel-go does, even when a variable is called `format`); other calls on
            // `format` are member calls on an undeclared identifier.
            if ns == "format" && (fname == "named" || super::named_format::lookup(fname).is_some())
            {
                global = format!("format.{fname}");
                target = None;
            }
        }
        if global == "cel.bind" && call.args.len() == 3 {
            let Expr::Ident(var) = &call.args[0].expr else {
                return Err(self.err(
                    call.args[0].id,
                    "cel.bind() variable name must be a simple identifier".into(),
                ));
            };
            let (init, it) = self.compile(&call.args[1])?;
            let slot = self.push(var, it);
            let body = self.compile(&call.args[2]);
            self.pop(1);
            let (body, bt) = body?;
            return Ok((
                Node::Bind {
                    slot,
                    init: Box::new(init),
                    body: Box::new(body),
                },
                bt,
            ));
        }
        if let Some(t) = target
            && call.args.len() == 3
            && matches!(fname, "all" | "exists" | "existsOne")
        {
            return self.macro3(id, fname, t, &call.args);
        }
        if let Some(t) = target
            && matches!(call.args.len(), 3 | 4)
            && matches!(
                fname,
                "transformList" | "transformMap" | "transformMapEntry"
            )
        {
            return self.transform(fname, t, &call.args);
        }
        if let Some(t) = target
            && call.args.len() == 2
            && fname == "sortBy"
        {
            return self.sort_by(t, &call.args);
        }
        match fname {
            "_&&_" | "_||_" => {
                let (a, at) = self.compile(&call.args[0])?;
                let (b, bt) = self.compile(&call.args[1])?;
                if !Ty::Bool.accepts(&at) || !Ty::Bool.accepts(&bt) {
                    return Err(self.err(
                        id,
                        format!(
                            "found no matching overload for '{fname}' applied to '({at}, {bt})'"
                        ),
                    ));
                }
                let n = if fname == "_&&_" {
                    Node::And(Box::new(a), Box::new(b))
                } else {
                    Node::OrOp(Box::new(a), Box::new(b))
                };
                return Ok((n, Ty::Bool));
            }
            "_?_:_" => {
                let (c, ct) = self.compile(&call.args[0])?;
                let (a, at) = self.compile(&call.args[1])?;
                let (b, bt) = self.compile(&call.args[2])?;
                let rt = if Ty::Bool.accepts(&ct) {
                    at.unify(&bt)
                } else {
                    None
                };
                let Some(rt) = rt else {
                    return Err(self.err(
                        id,
                        format!(
                            "found no matching overload for '_?_:_' applied to '({ct}, {at}, {bt})'"
                        ),
                    ));
                };
                return Ok((Node::Cond(Box::new(c), Box::new(a), Box::new(b)), rt));
            }
            "_?._" => {
                let (op, t) = self.compile(&call.args[0])?;
                let Expr::Literal(LiteralValue::String(f)) = &call.args[1].expr else {
                    return Err(self.err(id, "unsupported optional field selection".into()));
                };
                let inner = match &t {
                    Ty::Device => match f.inner() {
                        "driver" => Ty::Str,
                        "attributes" => attr_map_ty(),
                        "capacity" => cap_map_ty(),
                        "allowMultipleAllocations" => Ty::Bool,
                        other => return Err(self.err(id, format!("undefined field '{other}'"))),
                    },
                    Ty::Map(_, v) => (**v).clone(),
                    Ty::Opt(inner) => match &**inner {
                        Ty::Map(_, v) => (**v).clone(),
                        _ => Ty::Dyn,
                    },
                    t if t.is_dyn() => Ty::Dyn,
                    _ => {
                        return Err(
                            self.err(id, format!("type '{t}' does not support field selection"))
                        );
                    }
                };
                return Ok((
                    Node::OptSelect {
                        operand: Box::new(op),
                        field: Value::str(f.inner()),
                    },
                    Ty::opt(inner),
                ));
            }
            _ => {}
        }
        // regex with literal pattern: validate at compile time (ValidateRegexLiterals)
        if let (Some(t), true) = (
            target,
            matches!(fname, "matches" | "find" | "findAll") && call.args.len() == 1,
        ) && let Expr::Literal(LiteralValue::String(p)) = &call.args[0].expr
        {
            let re = regex::Regex::new(p.inner())
                .map_err(|e| self.err(call.args[0].id, format!("invalid matches argument: {e}")))?;
            let (tn, tt) = self.compile(t)?;
            if !Ty::Str.accepts(&tt) {
                return Err(self.err(
                    id,
                    format!("found no matching overload for '{fname}' applied to '{tt}.(string)'"),
                ));
            }
            let (func, rt) = match fname {
                "matches" => (Func::Matches, Ty::Bool),
                "find" => (Func::Find, Ty::Str),
                _ => (Func::FindAll, Ty::list(Ty::Str)),
            };
            return Ok((
                Node::RegexCall {
                    func,
                    target: Box::new(tn),
                    re: Arc::new(re),
                },
                rt,
            ));
        }
        let is_format = fname == "format" && target.is_some();
        self.in_format += usize::from(is_format);
        let mut nodes = Vec::new();
        let mut tys = Vec::new();
        if let Some(t) = target {
            let (n, ty) = self.compile(t)?;
            nodes.push(n);
            tys.push(ty);
        }
        for a in &call.args {
            let (n, ty) = self.compile(a)?;
            nodes.push(n);
            tys.push(ty);
        }
        self.in_format -= usize::from(is_format);
        let member = target.is_some();
        match resolve(&global, member, &tys) {
            Ok((func, rt)) => {
                if func == Func::Format {
                    self.check_format(id, call);
                }
                Ok((Node::Call { func, args: nodes }, rt))
            }
            Err(None) => {
                let shown = if member {
                    format!(
                        "{}.({})",
                        tys[0],
                        tys[1..]
                            .iter()
                            .map(|t| t.to_string())
                            .collect::<Vec<_>>()
                            .join(", ")
                    )
                } else {
                    format!(
                        "({})",
                        tys.iter()
                            .map(|t| t.to_string())
                            .collect::<Vec<_>>()
                            .join(", ")
                    )
                };
                Err(self.err(
                    id,
                    format!("found no matching overload for '{global}' applied to '{shown}'"),
                ))
            }
            Err(Some(msg)) => Err(self.err(id, msg)),
        }
    }
}

impl Compiler<'_> {
    /// ext.Strings' format validator: a literal format string over a literal list.
    fn check_format(&mut self, id: u64, call: &CallExpr) {
        let (Some(t), [arg]) = (call.target.as_deref(), call.args.as_slice()) else {
            return;
        };
        let (Expr::Literal(LiteralValue::String(f)), Expr::List(l)) = (&t.expr, &arg.expr) else {
            return;
        };
        let args: Vec<_> = l.elements.iter().map(|e| self.static_arg(e)).collect();
        if let Err((at, msg)) = super::format::check(f.inner(), &args) {
            self.invalid.push((at.unwrap_or(id), msg));
        }
    }

    fn static_arg(&self, e: &IdedExpr) -> super::format::StaticArg {
        let members = match &e.expr {
            Expr::List(l) => l.elements.iter().map(|x| self.static_arg(x)).collect(),
            Expr::Map(m) => m
                .entries
                .iter()
                .filter_map(|en| match &en.expr {
                    EntryExpr::MapEntry(me) => Some([&me.key, &me.value]),
                    _ => None,
                })
                .flatten()
                .map(|x| self.static_arg(x))
                .collect(),
            _ => Vec::new(),
        };
        super::format::StaticArg {
            id: e.id,
            ty: self.format_types.get(&e.id).cloned().unwrap_or(Ty::Dyn),
            members,
        }
    }
}

fn type_name_static(n: &str) -> &'static str {
    match n {
        "int" => "int",
        "uint" => "uint",
        "double" => "double",
        "string" => "string",
        "bool" => "bool",
        "bytes" => "bytes",
        "list" => "list",
        "map" => "map",
        "null_type" => "null_type",
        _ => "type",
    }
}

fn iter_types(rt: &Ty, two: bool) -> Option<(Ty, Ty)> {
    match rt {
        Ty::List(e) => Some(if two {
            (Ty::Int, (**e).clone())
        } else {
            ((**e).clone(), Ty::Dyn)
        }),
        Ty::Map(k, v) => Some(((**k).clone(), (**v).clone())),
        Ty::Dyn | Ty::Any => Some((Ty::Dyn, Ty::Dyn)),
        _ => None,
    }
}

/// Overload resolution: `Err(None)` is "no matching overload", `Err(Some(msg))` another error.
fn resolve(name: &str, member: bool, t: &[Ty]) -> Result<(Func, Ty), Option<String>> {
    use Func as F;
    use Ty::*;
    let n = t.len();
    let d = |i: usize| t[i].is_dyn();
    let is = |i: usize, ty: &Ty| t[i].is_dyn() || &t[i] == ty;
    let list_like = |i: usize| matches!(t[i], List(_)) || d(i);
    let undeclared = || {
        Some(format!(
            "undeclared reference to '{name}' (in container '')"
        ))
    };
    macro_rules! ok {
        ($f:expr, $r:expr) => {
            return Ok(($f, $r))
        };
    }
    if member && let Some((receiver, arity, result)) = authz_member(name) {
        if is(0, &Authz(receiver)) && n == arity + 1 && (1..n).all(|i| is(i, &Str)) {
            ok!(F::Authz(AuthzPrice::of(name)), result)
        }
        return Err(None);
    }
    match (name, member, n) {
        ("_+_", false, 2) => {
            let u = t[0].unify(&t[1]).ok_or(None)?;
            match &u {
                Int | Uint | Double | Str | Bytes | List(_) | Dyn => ok!(F::Add, u),
                _ => Err(None),
            }
        }
        ("_-_" | "_*_" | "_/_", false, 2) => {
            let u = t[0].unify(&t[1]).ok_or(None)?;
            if u.is_num() || u == Dyn {
                let f = match name {
                    "_-_" => F::Sub,
                    "_*_" => F::Mul,
                    _ => F::Div,
                };
                ok!(f, u)
            }
            Err(None)
        }
        ("_%_", false, 2) => {
            let u = t[0].unify(&t[1]).ok_or(None)?;
            if matches!(u, Int | Uint | Dyn) {
                ok!(F::Mod, u)
            }
            Err(None)
        }
        ("-_", false, 1) => {
            if matches!(t[0], Int | Double) || d(0) {
                ok!(F::Neg, if d(0) { Dyn } else { t[0].clone() })
            }
            Err(None)
        }
        ("!_", false, 1) => {
            if is(0, &Bool) {
                ok!(F::Not, Bool)
            }
            Err(None)
        }
        ("@not_strictly_false", false, 1) => ok!(F::NotStrictlyFalse, Bool),
        ("_==_" | "_!=_", false, 2) => {
            if t[0].unify(&t[1]).is_some() {
                ok!(if name == "_==_" { F::Eq } else { F::Ne }, Bool)
            }
            Err(None)
        }
        ("_<_" | "_<=_" | "_>_" | "_>=_", false, 2) => {
            let okk = (t[0].is_num() || d(0)) && (t[1].is_num() || d(1))
                || t[0]
                    .unify(&t[1])
                    .is_some_and(|u| matches!(u, Str | Bytes | Bool | Dyn));
            if okk {
                let f = match name {
                    "_<_" => F::Lt,
                    "_<=_" => F::Le,
                    "_>_" => F::Gt,
                    _ => F::Ge,
                };
                ok!(f, Bool)
            }
            Err(None)
        }
        ("@in", false, 2) => match &t[1] {
            List(e) if e.unify(&t[0]).is_some() => ok!(F::In, Bool),
            Map(k, _) if k.unify(&t[0]).is_some() => ok!(F::In, Bool),
            x if x.is_dyn() => ok!(F::In, Bool),
            _ => Err(None),
        },
        ("_[_]", false, 2) => match &t[0] {
            List(e) if is(1, &Int) || t[1] == Uint || t[1] == Double => {
                ok!(F::Index, (**e).clone())
            }
            Map(k, v) if k.unify(&t[1]).is_some() => ok!(F::Index, (**v).clone()),
            x if x.is_dyn() => ok!(F::Index, Dyn),
            _ => Err(None),
        },
        ("_[?_]", false, 2) => match &t[0] {
            List(e) => ok!(F::OptIndex, Ty::opt((**e).clone())),
            Map(_, v) => ok!(F::OptIndex, Ty::opt((**v).clone())),
            Opt(inner) => ok!(F::OptIndex, Ty::opt(inner.elem())),
            x if x.is_dyn() => ok!(F::OptIndex, Ty::opt(Dyn)),
            _ => Err(None),
        },
        ("size", _, 1) => {
            if matches!(t[0], Str | Bytes | List(_) | Map(_, _)) || d(0) {
                ok!(F::Size, Int)
            }
            Err(None)
        }
        ("contains" | "startsWith" | "endsWith", true, 2) => {
            if is(0, &Str) && is(1, &Str) {
                let f = match name {
                    "contains" => F::Contains,
                    "startsWith" => F::StartsWith,
                    _ => F::EndsWith,
                };
                ok!(f, Bool)
            }
            Err(None)
        }
        ("matches", _, 2) => {
            if is(0, &Str) && is(1, &Str) {
                ok!(F::Matches, Bool)
            }
            Err(None)
        }
        ("find", true, 2) if is(0, &Str) && is(1, &Str) => ok!(F::Find, Str),
        ("findAll", true, 2) if is(0, &Str) && is(1, &Str) => ok!(F::FindAll, List(Box::new(Str))),
        ("findAll", true, 3) if is(0, &Str) && is(1, &Str) && is(2, &Int) => {
            ok!(F::FindAll, List(Box::new(Str)))
        }
        ("int", false, 1) if matches!(t[0], Int | Uint | Double | Str) || d(0) => {
            ok!(F::ToInt, Int)
        }
        ("uint", false, 1) if matches!(t[0], Int | Uint | Double | Str) || d(0) => {
            ok!(F::ToUint, Uint)
        }
        ("double", false, 1) if matches!(t[0], Int | Uint | Double | Str) || d(0) => {
            ok!(F::ToDouble, Double)
        }
        ("string", false, 1)
            if matches!(t[0], Int | Uint | Double | Str | Bool | Bytes | Ip | Cidr) || d(0) =>
        {
            ok!(F::ToString, Str)
        }
        ("bool", false, 1) if matches!(t[0], Bool | Str) || d(0) => ok!(F::ToBool, Bool),
        ("type", false, 1) => ok!(F::TypeOf, Type),
        ("dyn", false, 1) => ok!(F::Dyn, Dyn),
        ("quantity", false, 1) if is(0, &Str) => ok!(F::Quantity, Quantity),
        ("isQuantity", false, 1) if is(0, &Str) => ok!(F::IsQuantity, Bool),
        ("isInteger", true, 1) if is(0, &Quantity) => ok!(F::QIsInteger, Bool),
        ("asInteger", true, 1) if is(0, &Quantity) => ok!(F::QAsInteger, Int),
        ("asApproximateFloat", true, 1) if is(0, &Quantity) => ok!(F::QAsApproximateFloat, Double),
        ("sign", false, 1) if is(0, &Quantity) => ok!(F::QSign, Int),
        ("add" | "sub", true, 2) if is(0, &Quantity) && (is(1, &Quantity) || t[1] == Int) => {
            ok!(if name == "add" { F::QAdd } else { F::QSub }, Quantity)
        }
        ("isGreaterThan" | "isLessThan" | "compareTo", true, 2)
            if (is(0, &Quantity) && is(1, &Quantity)) || (is(0, &Semver) && is(1, &Semver)) =>
        {
            match name {
                "isGreaterThan" => ok!(F::IsGreaterThan, Bool),
                "isLessThan" => ok!(F::IsLessThan, Bool),
                _ => ok!(F::CompareTo, Int),
            }
        }
        ("semver", false, 1) if is(0, &Str) => ok!(F::Semver, Semver),
        ("semver", false, 2) if is(0, &Str) && is(1, &Bool) => ok!(F::Semver, Semver),
        ("isSemver", false, 1) if is(0, &Str) => ok!(F::IsSemver, Bool),
        ("isSemver", false, 2) if is(0, &Str) && is(1, &Bool) => ok!(F::IsSemver, Bool),
        ("major" | "minor" | "patch", true, 1) if is(0, &Semver) => match name {
            "major" => ok!(F::Major, Int),
            "minor" => ok!(F::Minor, Int),
            _ => ok!(F::Patch, Int),
        },
        ("ip", false, 1) if is(0, &Str) => ok!(F::Ip, Ip),
        ("isIP", false, 1) if is(0, &Str) => ok!(F::IsIp, Bool),
        ("ip.isCanonical", false, 1) if is(0, &Str) => ok!(F::IpIsCanonical, Bool),
        ("family", true, 1) if is(0, &Ip) => ok!(F::IpFamily, Int),
        (
            "isUnspecified"
            | "isLoopback"
            | "isLinkLocalMulticast"
            | "isLinkLocalUnicast"
            | "isGlobalUnicast",
            true,
            1,
        ) if is(0, &Ip) => ok!(
            match name {
                "isUnspecified" => F::IpIsUnspecified,
                "isLoopback" => F::IpIsLoopback,
                "isLinkLocalMulticast" => F::IpIsLinkLocalMulticast,
                "isLinkLocalUnicast" => F::IpIsLinkLocalUnicast,
                _ => F::IpIsGlobalUnicast,
            },
            Bool
        ),
        ("cidr", false, 1) if is(0, &Str) => ok!(F::Cidr, Cidr),
        ("isCIDR", false, 1) if is(0, &Str) => ok!(F::IsCidr, Bool),
        ("containsIP", true, 2) if is(0, &Cidr) && (is(1, &Str) || t[1] == Ip) => {
            ok!(F::CidrContainsIp, Bool)
        }
        ("containsCIDR", true, 2) if is(0, &Cidr) && (is(1, &Str) || t[1] == Cidr) => {
            ok!(F::CidrContainsCidr, Bool)
        }
        ("ip", true, 1) if is(0, &Cidr) => ok!(F::CidrIp, Ip),
        ("masked", true, 1) if is(0, &Cidr) => ok!(F::CidrMasked, Cidr),
        ("prefixLength", true, 1) if is(0, &Cidr) => ok!(F::CidrPrefixLength, Int),
        ("url", false, 1) if is(0, &Str) => ok!(F::Url, Url),
        ("isURL", false, 1) if is(0, &Str) => ok!(F::IsUrl, Bool),
        ("getScheme" | "getHost" | "getHostname" | "getPort" | "getEscapedPath", true, 1)
            if is(0, &Url) =>
        {
            ok!(
                match name {
                    "getScheme" => F::UrlScheme,
                    "getHost" => F::UrlHost,
                    "getHostname" => F::UrlHostname,
                    "getPort" => F::UrlPort,
                    _ => F::UrlEscapedPath,
                },
                Str
            )
        }
        ("getQuery", true, 1) if is(0, &Url) => ok!(F::UrlQuery, Ty::map(Str, Ty::list(Str))),
        ("format.named", false, 1) if is(0, &Str) => ok!(F::FormatNamed, Ty::opt(Format)),
        ("validate", true, 2) if is(0, &Format) && is(1, &Str) => {
            ok!(F::FormatValidate, Ty::opt(Ty::list(Str)))
        }
        (_, false, 0) if let Some(i) = super::named_format::function_index(name) => {
            ok!(F::FormatOf(i as u8), Format)
        }
        ("check", true, 2)
            if (is(0, &Authz("PathCheck")) || is(0, &Authz("ResourceCheck"))) && is(1, &Str) =>
        {
            ok!(F::Authz(AuthzPrice::Check), Authz("Decision"))
        }
        ("charAt", true, 2) if is(0, &Str) && is(1, &Int) => ok!(F::CharAt, Str),
        ("indexOf" | "lastIndexOf", true, 2 | 3) if t[0] == Str || (d(0) && is(1, &Str)) => {
            if is(1, &Str) && (n == 2 || is(2, &Int)) {
                ok!(
                    if name == "indexOf" {
                        F::IndexOf
                    } else {
                        F::LastIndexOf
                    },
                    Int
                )
            }
            Err(None)
        }
        ("indexOf" | "lastIndexOf", true, 2) if list_like(0) => {
            ok!(
                if name == "indexOf" {
                    F::IndexOf
                } else {
                    F::LastIndexOf
                },
                Int
            )
        }
        ("lowerAscii", true, 1) if is(0, &Str) => ok!(F::LowerAscii, Str),
        ("upperAscii", true, 1) if is(0, &Str) => ok!(F::UpperAscii, Str),
        ("trim", true, 1) if is(0, &Str) => ok!(F::Trim, Str),
        ("replace", true, 3 | 4)
            if is(0, &Str) && is(1, &Str) && is(2, &Str) && (n == 3 || is(3, &Int)) =>
        {
            ok!(F::Replace, Str)
        }
        ("split", true, 2 | 3) if is(0, &Str) && is(1, &Str) && (n == 2 || is(2, &Int)) => {
            ok!(F::Split, List(Box::new(Str)))
        }
        ("substring", true, 2 | 3) if is(0, &Str) && is(1, &Int) && (n == 2 || is(2, &Int)) => {
            ok!(F::Substring, Str)
        }
        ("join", true, 1 | 2)
            if (t[0] == List(Box::new(Str)) || list_like(0)) && (n == 1 || is(1, &Str)) =>
        {
            ok!(F::Join, Str)
        }
        ("reverse", true, 1) if is(0, &Str) => ok!(F::Reverse, Str),
        ("reverse", true, 1) if list_like(0) => ok!(F::Reverse, t[0].clone()),
        ("isSorted", true, 1) if list_like(0) => ok!(F::IsSorted, Bool),
        ("sum", true, 1) if list_like(0) => ok!(F::Sum, t[0].elem()),
        ("min" | "max", true, 1) if list_like(0) => {
            ok!(if name == "min" { F::Min } else { F::Max }, t[0].elem())
        }
        ("slice", true, 3) if list_like(0) && is(1, &Int) && is(2, &Int) => {
            ok!(F::Slice, t[0].clone())
        }
        ("flatten", true, 1 | 2) if list_like(0) => ok!(F::Flatten, List(Box::new(Dyn))),
        ("distinct", true, 1) if list_like(0) => ok!(F::Distinct, t[0].clone()),
        ("sort", true, 1) if list_like(0) => ok!(F::Sort, t[0].clone()),
        ("includes", true, 2) => ok!(F::Includes, Bool),
        ("strings.quote", false, 1) if is(0, &Str) => ok!(F::Quote, Str),
        ("format", true, 2) if is(0, &Str) && list_like(1) => ok!(F::Format, Str),
        ("first" | "last", true, 1) if list_like(0) => {
            ok!(
                if name == "first" { F::First } else { F::Last },
                Ty::opt(t[0].elem())
            )
        }
        ("lists.range", false, 1) if is(0, &Int) => ok!(F::ListsRange, List(Box::new(Int))),
        ("sets.contains" | "sets.equivalent" | "sets.intersects", false, 2)
            if list_like(0) && list_like(1) =>
        {
            if t[0].unify(&t[1]).is_none() {
                return Err(None);
            }
            match name {
                "sets.contains" => ok!(F::SetsContains, Bool),
                "sets.equivalent" => ok!(F::SetsEquivalent, Bool),
                _ => ok!(F::SetsIntersects, Bool),
            }
        }
        ("optional.of", false, 1) => ok!(F::OptionalOf, Ty::opt(t[0].clone())),
        ("optional.ofNonZeroValue", false, 1) => ok!(F::OptionalOfNonZero, Ty::opt(t[0].clone())),
        ("optional.none", false, 0) => ok!(F::OptionalNone, Ty::opt(Dyn)),
        ("hasValue", true, 1) if matches!(t[0], Opt(_)) || d(0) => ok!(F::HasValue, Bool),
        ("value", true, 1) if matches!(t[0], Opt(_)) || d(0) => ok!(F::OptValue, inner_opt(&t[0])),
        ("orValue", true, 2) if matches!(t[0], Opt(_)) || d(0) => {
            let it = inner_opt(&t[0]);
            let u = it.unify(&t[1]).ok_or(None)?;
            ok!(F::OrValue, u)
        }
        ("or", true, 2) if (matches!(t[0], Opt(_)) || d(0)) && (matches!(t[1], Opt(_)) || d(1)) => {
            let u = t[0].unify(&t[1]).ok_or(None)?;
            ok!(F::Or, u)
        }
        _ => {
            if known_function(name) {
                Err(None)
            } else {
                Err(undeclared())
            }
        }
    }
}

/// The authz library's member functions but `check` (the only one with two receivers), with the
/// field and label selectors: receiver, number of arguments (all strings) and result.
fn authz_member(name: &str) -> Option<(&'static str, usize, Ty)> {
    let a = Ty::Authz;
    Some(match name {
        "path" => ("Authorizer", 1, a("PathCheck")),
        "group" => ("Authorizer", 1, a("GroupCheck")),
        "serviceAccount" => ("Authorizer", 2, a("Authorizer")),
        "resource" => ("GroupCheck", 1, a("ResourceCheck")),
        "subresource" | "namespace" | "name" | "fieldSelector" | "labelSelector" => {
            ("ResourceCheck", 1, a("ResourceCheck"))
        }
        "allowed" | "errored" => ("Decision", 0, Ty::Bool),
        "reason" | "error" => ("Decision", 0, Ty::Str),
        _ => return None,
    })
}

fn inner_opt(t: &Ty) -> Ty {
    match t {
        Ty::Opt(i) => (**i).clone(),
        _ => Ty::Dyn,
    }
}

fn known_function(name: &str) -> bool {
    matches!(
        name,
        "_+_"
            | "_-_"
            | "_*_"
            | "_/_"
            | "_%_"
            | "-_"
            | "!_"
            | "_==_"
            | "_!=_"
            | "_<_"
            | "_<=_"
            | "_>_"
            | "_>=_"
            | "@in"
            | "_[_]"
            | "_[?_]"
            | "size"
            | "contains"
            | "startsWith"
            | "endsWith"
            | "matches"
            | "find"
            | "findAll"
            | "int"
            | "uint"
            | "double"
            | "string"
            | "bool"
            | "type"
            | "dyn"
            | "quantity"
            | "isQuantity"
            | "isInteger"
            | "asInteger"
            | "asApproximateFloat"
            | "sign"
            | "add"
            | "sub"
            | "isGreaterThan"
            | "isLessThan"
            | "compareTo"
            | "semver"
            | "isSemver"
            | "major"
            | "minor"
            | "patch"
            | "charAt"
            | "indexOf"
            | "lastIndexOf"
            | "lowerAscii"
            | "upperAscii"
            | "trim"
            | "replace"
            | "split"
            | "substring"
            | "join"
            | "reverse"
            | "isSorted"
            | "sum"
            | "min"
            | "max"
            | "slice"
            | "flatten"
            | "distinct"
            | "sort"
            | "first"
            | "last"
            | "lists.range"
            | "sets.contains"
            | "includes"
            | "strings.quote"
            | "format"
            | "sets.equivalent"
            | "sets.intersects"
            | "optional.of"
            | "optional.ofNonZeroValue"
            | "optional.none"
            | "hasValue"
            | "value"
            | "orValue"
            | "or"
            | "ip"
            | "isIP"
            | "ip.isCanonical"
            | "family"
            | "isUnspecified"
            | "isLoopback"
            | "isLinkLocalMulticast"
            | "isLinkLocalUnicast"
            | "isGlobalUnicast"
            | "cidr"
            | "isCIDR"
            | "containsIP"
            | "containsCIDR"
            | "masked"
            | "prefixLength"
            | "url"
            | "isURL"
            | "getScheme"
            | "getHost"
            | "getHostname"
            | "getPort"
            | "getEscapedPath"
            | "getQuery"
            | "check"
            | "format.named"
            | "validate"
    ) || authz_member(name).is_some()
        || super::named_format::function_index(name).is_some()
}
