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
    pub(super) fn ident(&mut self, id: u64, name: &str) -> R {
        if let Some((_, slot, ty)) = self.scopes.iter().rev().find(|(n, _, _)| n == name) {
            if *ty == Ty::Type {
                // cel-go's planner takes an identifier of type `type` for a type's name
                self.unplannable.get_or_insert_with(|| {
                    format!("program instantiation failed: reference to undefined type: {name}")
                });
            }
            return Ok((Node::Local(*slot), ty.clone()));
        }
        match name {
            "device" => Ok((Node::Device, Ty::Device)),
            "int" | "uint" | "double" | "string" | "bool" | "bytes" | "list" | "map"
            | "null_type" | "type" | "optional_type" => {
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
        let ty = self.field_ty(id, &t, sel.field.as_str())?;
        let ty = match (&t, sel.test) {
            (_, true) => Ty::Bool,
            // a field of an optional value is an optional
            (Ty::Opt(_), false) => Ty::opt(ty),
            _ => ty,
        };
        let field = sel.field.as_str();
        Ok((
            Node::Select {
                operand: Box::new(op),
                field: Value::str(field),
                test: sel.test,
            },
            ty,
        ))
    }

    /// The type of field `field` of a value of type `t` (of the value an optional may hold), as
    /// cel-go's checker has it: a map's value type whatever its key type, the `device` object's
    /// fields, `dyn` on `dyn`.
    pub(super) fn field_ty(&self, id: u64, t: &Ty, field: &str) -> Result<Ty, String> {
        let holder = match t {
            Ty::Opt(inner) => &**inner,
            t => t,
        };
        Ok(match holder {
            Ty::Device => match field {
                "driver" => Ty::Str,
                "attributes" => attr_map_ty(),
                "capacity" => cap_map_ty(),
                "allowMultipleAllocations" => Ty::Bool,
                _ => return Err(self.err(id, format!("undefined field '{field}'"))),
            },
            Ty::Map(_, v) => (**v).clone(),
            h if h.is_dyn() => Ty::Dyn,
            h => {
                return Err(self.err(id, format!("type '{h}' does not support field selection")));
            }
        })
    }

    pub(super) fn list(&mut self, l: &ListExpr) -> R {
        let mut elems = Vec::new();
        let mut optional = vec![false; l.elements.len()];
        let mut ety: Option<Ty> = None;
        let mut first: Option<Ty> = None;
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
            if let Some(first) = &first
                && !first.exactly(&t)
                && self.in_format == 0
                && !mismatched
            {
                // the homogeneous-literal validator's error (exact types, against the first
                // element); inside `format` upstream exempts it
                self.invalid
                    .push((el.id, format!("expected type '{first}' but found '{t}'")));
                mismatched = true;
            }
            first.get_or_insert_with(|| t.clone());
            ety = Some(match ety {
                None => t,
                Some(prev) => prev.join(&t).unwrap_or(Ty::Dyn),
            });
            elems.push(n);
        }
        Ok((
            Node::List { elems, optional },
            Ty::list(ety.unwrap_or(Ty::Free)),
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
            Ty::map(kt.unwrap_or(Ty::Free), vt.unwrap_or(Ty::Free)),
        ))
    }

    pub(super) fn comprehension(&mut self, id: u64, c: &ComprehensionExpr) -> R {
        if c.iter_var2.is_none() && self.camel_exists_one(id) {
            return Err(self.err(
                id,
                "undeclared reference to 'existsOne' (in container '')".into(),
            ));
        }
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
        // the step's type binds what the accumulator's left open (`map`'s `[]`), as cel-go's
        // assignment check does; the result sees only the accumulator
        if let Some(entry) = self.scopes.last_mut() {
            entry.2 = at.fill(&st);
        }
        let (result, rt2) = self.compile(&c.result)?;
        self.pop(1);
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
        "optional_type" => "optional_type",
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
        t if t.is_dyn() => Some((Ty::Dyn, Ty::Dyn)),
        _ => None,
    }
}
