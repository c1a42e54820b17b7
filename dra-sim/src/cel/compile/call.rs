//! Type checking of calls: the name a call is resolved by (namespaced globals), the macros the
//! parser leaves as calls (see `macros`), the logical and conditional operators and optional
//! selection, regex literals (compiled and validated here), and library functions through
//! overload resolution (`lib::resolve`), with ext.Strings' compile-time `format` check.
use super::{Compiler, Node, R};
use crate::cel::func::Func;
use crate::cel::lib::format::{self, StaticArg};
use crate::cel::lib::resolve;
use crate::cel::types::Ty;
use crate::cel::value::{Value, named_format};
use cel::IdedExpr;
use cel::common::ast::{CallExpr, EntryExpr, Expr, LiteralValue};
use std::sync::Arc;

impl Compiler<'_> {
    pub(super) fn call(&mut self, id: u64, call: &CallExpr) -> R {
        let fname = call.func_name.as_str();
        let (global, target) = self.namespaced(call);
        if let Some(r) = self.macro_call(id, &global, target, call) {
            return r;
        }
        match fname {
            "_&&_" | "_||_" => return self.logical(id, fname, call),
            "_?_:_" => return self.conditional(id, call),
            "_?._" => return self.opt_select(id, call),
            _ => {}
        }
        // regex with literal pattern: validate at compile time (ValidateRegexLiterals)
        if let Some(t) = target
            && matches!(fname, "matches" | "find" | "findAll")
            && call.args.len() == 1
            && let Expr::Literal(LiteralValue::String(p)) = &call.args[0].expr
        {
            let re = regex::Regex::new(p.inner())
                .map_err(|e| self.err(call.args[0].id, format!("invalid matches argument: {e}")))?;
            return self.regex_literal(id, fname, t, re);
        }
        self.function(id, &global, target, call)
    }

    /// The name a call is resolved by, and its receiver: a global of a namespace (`sets.contains`,
    /// `format.named`) is written as a member call on the namespace's name.
    fn namespaced<'c>(&self, call: &'c CallExpr) -> (String, Option<&'c IdedExpr>) {
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
            if ns == "format" && (fname == "named" || named_format::lookup(fname).is_some()) {
                global = format!("format.{fname}");
                target = None;
            }
        }
        (global, target)
    }

    /// `&&` and `||`.
    fn logical(&mut self, id: u64, fname: &str, call: &CallExpr) -> R {
        let (a, at) = self.compile(&call.args[0])?;
        let (b, bt) = self.compile(&call.args[1])?;
        if !Ty::Bool.accepts(&at) || !Ty::Bool.accepts(&bt) {
            return Err(self.err(
                id,
                format!("found no matching overload for '{fname}' applied to '({at}, {bt})'"),
            ));
        }
        let n = if fname == "_&&_" {
            Node::And(Box::new(a), Box::new(b))
        } else {
            Node::OrOp(Box::new(a), Box::new(b))
        };
        Ok((n, Ty::Bool))
    }

    /// `c ? a : b`.
    fn conditional(&mut self, id: u64, call: &CallExpr) -> R {
        let (c, ct) = self.compile(&call.args[0])?;
        let (a, at) = self.compile(&call.args[1])?;
        let (b, bt) = self.compile(&call.args[2])?;
        let rt = if Ty::Bool.accepts(&ct) {
            at.bind(&bt)
        } else {
            None
        };
        let Some(rt) = rt else {
            return Err(self.err(
                id,
                format!("found no matching overload for '_?_:_' applied to '({ct}, {at}, {bt})'"),
            ));
        };
        Ok((Node::Cond(Box::new(c), Box::new(a), Box::new(b)), rt))
    }

    /// Optional field selection (`x.?f`).
    fn opt_select(&mut self, id: u64, call: &CallExpr) -> R {
        let (op, t) = self.compile(&call.args[0])?;
        let Expr::Literal(LiteralValue::String(f)) = &call.args[1].expr else {
            return Err(self.err(id, "unsupported optional field selection".into()));
        };
        let inner = self.field_ty(id, &t, f.inner())?;
        Ok((
            Node::OptSelect {
                operand: Box::new(op),
                field: Value::str(f.inner()),
            },
            Ty::opt(inner),
        ))
    }

    /// `matches`, `find` or `findAll` with a literal pattern, compiled once here.
    fn regex_literal(&mut self, id: u64, fname: &str, t: &IdedExpr, re: regex::Regex) -> R {
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
        Ok((
            Node::RegexCall {
                func,
                target: Box::new(tn),
                re: Arc::new(re),
            },
            rt,
        ))
    }

    /// A library function: its receiver and arguments compiled, then overload resolution.
    fn function(&mut self, id: u64, global: &str, target: Option<&IdedExpr>, call: &CallExpr) -> R {
        let fname = call.func_name.as_str();
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
        match resolve(global, member, &tys) {
            Ok((func, rt)) => {
                if func == Func::Format {
                    self.check_format(id, call);
                }
                if tys.iter().any(Ty::is_open) {
                    let operands: Vec<&IdedExpr> = target.into_iter().chain(&call.args).collect();
                    self.bind_open_locals(global, &operands, &tys);
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

    /// cel-go types the members of `[]` (the keys and values of `{}`) by a type variable that the
    /// first operator they meet binds for the rest of the expression: after `x != 1`, `x` is an
    /// int there, and `x.size()` no longer compiles. We bind the variable the operand names.
    fn bind_open_locals(&mut self, op: &str, args: &[&IdedExpr], tys: &[Ty]) {
        for (i, e) in args.iter().enumerate() {
            let Expr::Ident(name) = &e.expr else { continue };
            let bound = match tys {
                [t] => open_unary(op, t),
                [_, _] => open_binding(op, i, &tys[i], &tys[1 - i]),
                _ => None,
            };
            let Some(bound) = bound else { continue };
            if let Some(entry) = self.scopes.iter_mut().rev().find(|(n, _, _)| n == name) {
                entry.2 = bound;
            }
        }
    }

    /// ext.Strings' format validator: a literal format string over a literal list.
    fn check_format(&mut self, id: u64, call: &CallExpr) {
        let (Some(t), [arg]) = (call.target.as_deref(), call.args.as_slice()) else {
            return;
        };
        let (Expr::Literal(LiteralValue::String(f)), Expr::List(l)) = (&t.expr, &arg.expr) else {
            return;
        };
        let args: Vec<_> = l.elements.iter().map(|e| self.static_arg(e)).collect();
        if let Err((at, msg)) = format::check(f.inner(), &args) {
            self.invalid.push((at.unwrap_or(id), msg));
        }
    }

    fn static_arg(&self, e: &IdedExpr) -> StaticArg {
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
        StaticArg {
            id: e.id,
            ty: self.format_types.get(&e.id).cloned().unwrap_or(Ty::Dyn),
            members,
        }
    }
}

/// What the open operand of a one-operand function is bound to: its first overload's type
/// (a conversion's identity, `size` of bytes, `-` of a double).
fn open_unary(f: &str, t: &Ty) -> Option<Ty> {
    let first = match f {
        "size" | "bytes" => Ty::Bytes,
        "-_" | "double" => Ty::Double,
        "!_" | "bool" => Ty::Bool,
        "int" => Ty::Int,
        "uint" => Ty::Uint,
        "string" => Ty::Str,
        _ => return None,
    };
    (*t == Ty::Free).then_some(first)
}

/// What an operand of open type `t` at position `pos` of operator `op` is bound to by the first
/// of cel-go's overloads (in its declaration order) that takes the other operand, `other`.
fn open_binding(op: &str, pos: usize, t: &Ty, other: &Ty) -> Option<Ty> {
    if !t.is_open() || other.is_open() || other.is_dyn() {
        return None;
    }
    let scalar = matches!(
        other,
        Ty::Int | Ty::Uint | Ty::Double | Ty::Str | Ty::Bytes | Ty::Bool
    );
    let same = match op {
        "_==_" | "_!=_" => other.clone(),
        "_+_" if scalar || matches!(other, Ty::List(_)) => other.clone(),
        "_-_" | "_*_" | "_/_" | "_%_" if other.is_num() => other.clone(),
        // `less_int64_double` and `less_int64_uint64` come before the uint and double
        // overloads: an open left operand against any number is an int
        "_<_" | "_<=_" | "_>_" | "_>=_" if pos == 0 && other.is_num() => Ty::Int,
        "_<_" | "_<=_" | "_>_" | "_>=_" if scalar => other.clone(),
        "@in" if pos == 0 => match other {
            Ty::List(e) => (**e).clone(),
            Ty::Map(k, _) => (**k).clone(),
            _ => return None,
        },
        // `in_list` comes first: an open range of a member is a list of it
        "@in" if *t == Ty::Free => Ty::list(other.clone()),
        _ => return None,
    };
    let bound = t.fill(&same);
    t.accepts(&bound).then_some(bound)
}
