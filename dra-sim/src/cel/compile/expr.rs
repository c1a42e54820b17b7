//! Type checking of the expressions that are not calls: literals, identifiers, field selection,
//! list and map literals, and the comprehensions the parser's macros produce.
use super::{Comp, Compiler, Node, R, attr_map_ty, cap_map_ty};
use crate::cel::types::Ty;
use crate::cel::value::Value;
use cel::common::ast::{
    ComprehensionExpr, EntryExpr, Expr, ListExpr, LiteralValue, MapExpr, SelectExpr,
};
use std::sync::Arc;

pub(super) fn literal(l: &LiteralValue) -> (Node, Ty) {
    match l {
        LiteralValue::Boolean(b) => (Node::Const(Value::Bool(*b.inner())), Ty::Bool),
        LiteralValue::Int(i) => (Node::Const(Value::Int(*i.inner())), Ty::Int),
        LiteralValue::UInt(u) => (Node::Const(Value::Uint(*u.inner())), Ty::Uint),
        LiteralValue::Double(d) => (Node::Const(Value::Double(*d.inner())), Ty::Double),
        LiteralValue::String(s) => (Node::Const(Value::str(s.inner())), Ty::Str),
        LiteralValue::Bytes(b) => (Node::Const(Value::Bytes(Arc::from(b.inner()))), Ty::Bytes),
        LiteralValue::Null => (Node::Const(Value::Null), Ty::Null),
    }
}

impl Compiler<'_> {
    pub(super) fn ident(&self, id: u64, name: &str) -> R {
        if let Some((_, slot, ty)) = self.scopes.iter().rev().find(|(n, _, _)| n == name) {
            return Ok((Node::Local(*slot), ty.clone()));
        }
        match name {
            "device" => Ok((Node::Device, Ty::Device)),
            "int" | "uint" | "double" | "string" | "bool" | "bytes" | "list" | "map"
            | "null_type" | "type" => {
                Ok((Node::Const(Value::Type(type_name_static(name))), Ty::Type))
            }
            _ => Err(self.err(
                id,
                format!("undeclared reference to '{name}' (in container '')"),
            )),
        }
    }

    pub(super) fn select(&mut self, id: u64, sel: &SelectExpr) -> R {
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
                _ => return Err(self.err(id, format!("undefined field '{field}'"))),
            },
            Ty::Map(k, v) => {
                if !k.accepts(&Ty::Str) {
                    return Err(
                        self.err(id, format!("type '{t}' does not support field selection"))
                    );
                }
                (**v).clone()
            }
            Ty::Dyn | Ty::Any => Ty::Dyn,
            _ => {
                return Err(self.err(id, format!("type '{t}' does not support field selection")));
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

    pub(super) fn list(&mut self, l: &ListExpr) -> R {
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
                            self.invalid
                                .push((el.id, format!("expected type '{prev}' but found '{t}'")));
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

    pub(super) fn map(&mut self, m: &MapExpr) -> R {
        let mut entries = Vec::new();
        let mut kt: Option<Ty> = None;
        let mut vt: Option<Ty> = None;
        for entry in &m.entries {
            let EntryExpr::MapEntry(me) = &entry.expr else {
                return Err(self.err(entry.id, "unsupported struct field in map literal".into()));
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

    pub(super) fn comprehension(&mut self, c: &ComprehensionExpr) -> R {
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

pub(super) fn iter_types(rt: &Ty, two: bool) -> Option<(Ty, Ty)> {
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
