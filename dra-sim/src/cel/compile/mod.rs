//! From the `cel` crate's parsed AST to our typed program: type checking with the DRA declarations
//! and library signatures, two-variable comprehensions and `cel.bind` (which the crate's parser
//! leaves as plain calls), and regex literal validation.
//!
//! `expr` checks the expressions that are not calls, `call` the calls (operators, regex literals,
//! library functions), `macros` expands the macros the parser leaves as calls. They are `impl`
//! blocks of the one [`Compiler`] and call each other through it: checking is recursive descent
//! (a call's arguments are expressions, an expression may be a call). The program they build is
//! `node`; the libraries' signatures are `lib`.
mod call;
mod expr;
mod macros;

use super::node::{Comp, Node};
use super::types::Ty;
use cel::IdedExpr;
use cel::common::ast::Expr;

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
    /// The first error cel-go's planner would raise for what checking saw (see `ident`).
    pub unplannable: Option<String>,
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
            unplannable: None,
        }
    }

    /// A map literal's key or value type joined with the previous ones; a mismatch is the
    /// homogeneous-literal validator's error (every one, unlike lists), unless inside `format`.
    fn join_entry(&mut self, prev: Option<Ty>, t: Ty, id: u64) -> Ty {
        let Some(p) = prev else { return t };
        if !p.exactly(&t) && self.in_format == 0 {
            self.invalid
                .push((id, format!("expected type '{p}' but found '{t}'")));
        }
        p.join(&t).unwrap_or(Ty::Dyn)
    }

    /// Whether the macro expanded at `id` was written `existsOne(x, p)`: the `cel` crate's
    /// parser expands it like `exists_one`, cel-go knows only the three-argument form.
    fn camel_exists_one(&self, id: u64) -> bool {
        let Some((start, _)) = self.src.offset_for(id) else {
            return false;
        };
        let (Some(head), Some(tail)) = (
            self.text.get(..start as usize),
            self.text.get(start as usize..),
        ) else {
            return false;
        };
        tail.starts_with("existsOne") || head.trim_end().ends_with("existsOne")
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
            Expr::Literal(l) => Ok(expr::literal(l)),
            Expr::Ident(name) => self.ident(e.id, name),
            Expr::Select(sel) => self.select(e.id, sel),
            Expr::Call(call) => self.call(e.id, call),
            Expr::List(l) => self.list(l),
            Expr::Map(m) => self.map(m),
            Expr::Comprehension(c) => self.comprehension(e.id, c),
            Expr::Struct(_) => Err(self.err(
                e.id,
                "struct literals are not supported in this environment".into(),
            )),
            Expr::Unspecified => Err(self.err(e.id, "unspecified expression".into())),
        }
    }
}
