//! The macros the `cel` crate's parser leaves as plain calls, expanded into our comprehension
//! nodes: `cel.bind`, the two-variable comprehensions (`all`, `exists`, `existsOne` with two
//! variables), ext.TwoVarComprehensions' `transformList`, `transformMap` and `transformMapEntry`
//! (with and without filter), and the ext.Lists `sortBy` macro.
use super::expr::iter_types;
use super::{Comp, Compiler, Node, R};
use crate::cel::func::Func;
use crate::cel::types::Ty;
use crate::cel::value::Value;
use cel::IdedExpr;
use cel::common::ast::{CallExpr, Expr};

struct TwoVars {
    v1: String,
    v2: String,
    range: Node,
    t1: Ty,
    t2: Ty,
}

impl Compiler<'_> {
    /// The expansion of a macro call; `None` when the call is not one.
    pub(super) fn macro_call(
        &mut self,
        id: u64,
        global: &str,
        target: Option<&IdedExpr>,
        call: &CallExpr,
    ) -> Option<R> {
        let fname = call.func_name.as_str();
        if global == "cel.bind" && call.args.len() == 3 {
            return Some(self.bind(&call.args));
        }
        let t = target?;
        match (fname, call.args.len()) {
            ("all" | "exists" | "existsOne", 3) => Some(self.macro3(id, fname, t, &call.args)),
            // cel-go's two-variable comprehensions take the snake-case spelling too
            ("exists_one", 3) => Some(self.macro3(id, "existsOne", t, &call.args)),
            ("transformList" | "transformMap" | "transformMapEntry", 3 | 4) => {
                Some(self.transform(fname, t, &call.args))
            }
            ("sortBy", 2) => Some(self.sort_by(t, &call.args)),
            _ => None,
        }
    }

    /// `cel.bind(var, init, body)`.
    fn bind(&mut self, args: &[IdedExpr]) -> R {
        let Expr::Ident(var) = &args[0].expr else {
            return Err(self.err(
                args[0].id,
                "cel.bind() variable name must be a simple identifier".into(),
            ));
        };
        let (init, it) = self.compile(&args[1])?;
        let slot = self.push(var, it);
        let body = self.compile(&args[2]);
        self.pop(1);
        let (body, bt) = body?;
        Ok((
            Node::Bind {
                slot,
                init: Box::new(init),
                body: Box::new(body),
            },
            bt,
        ))
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
        let filter = self.transform_filter(args)?;
        let body = self.compile(&args[args.len() - 1]);
        self.pop(3);
        let (body, bt) = body?;
        let body_id = args[args.len() - 1].id;
        let (init, step, rty) = self.transform_step(kind, accu, (var1, t1), (body, bt), body_id)?;
        let acc = || Box::new(Node::Local(accu));
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

    /// A transform's filter (the argument before the last of four), which must be a bool; the
    /// three variables are dropped on an error.
    fn transform_filter(&mut self, args: &[IdedExpr]) -> Result<Option<Node>, String> {
        if args.len() != 4 {
            return Ok(None);
        }
        match self.compile(&args[2]) {
            Ok((f, ft)) if Ty::Bool.accepts(&ft) => Ok(Some(f)),
            Ok((_, ft)) => {
                self.pop(3);
                Err(self.err(
                    args[2].id,
                    format!("found no matching overload for '_?_:_' applied to '({ft}, dyn, dyn)'"),
                ))
            }
            Err(e) => {
                self.pop(3);
                Err(e)
            }
        }
    }

    /// A transform's accumulator start, its step with the compiled body and the result type,
    /// given the first variable's slot and type and the body with its type.
    fn transform_step(
        &self,
        kind: &str,
        accu: usize,
        (var1, t1): (usize, Ty),
        (body, bt): (Node, Ty),
        body_id: u64,
    ) -> Result<(Node, Node, Ty), String> {
        Ok(match kind {
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
                            body_id,
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
        })
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
        let (key, kt) = match key {
            Ok(k) => k,
            Err(e) => {
                self.pop(1);
                return Err(e);
            }
        };
        // the keys must be of a comparable type; a `dyn` one picks the overload at run time
        let func = match kt {
            Ty::Int | Ty::Uint | Ty::Double | Ty::Bool | Ty::Str | Ty::Bytes => Func::SortByKeys,
            t if t.is_dyn() => Func::SortByKeysDyn,
            t => {
                self.pop(1);
                return Err(self.err(
                    args[1].id,
                    format!("found no matching overload for '@sortByAssociatedKeys' applied to '{rt}.(list({t}))'"),
                ));
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
                    func,
                    args: vec![Node::Local(input), keys],
                }),
            },
            rt,
        ))
    }
}
