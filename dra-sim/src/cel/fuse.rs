//! Fuses the device accesses selectors are made of (`device.driver`,
//! `device.attributes['gpu.nvidia.com'].productName`, `device.capacity[d].memory`, with `[..]`,
//! `.?`, `[?..]` and `has()`) into single nodes that read the one attribute they need from the
//! ResourceSlice device. The unfused program would first build the whole `device` value (every
//! attribute and capacity of the device converted), which dominates a cold allocation over
//! thousands of nodes. Fused nodes charge the cost the unfused ones would have, and give the same
//! values and errors; any other use of `device` still sees the whole value.
use super::func::Func;
use super::node::{Comp, DeviceProp, FieldMode, Node};
use super::value::Value;
use std::sync::Arc;

/// What the unfused `device.<map>[domain].<id>` charges: the outer access, the domain access,
/// the map selection and the `device` reference, one each.
pub const FIELD_COST: u64 = 4;
/// `device.<prop>`: the selection and the `device` reference.
pub const PROP_COST: u64 = 2;

pub fn fuse(n: Node) -> Node {
    let n = fuse_children(n);
    match n {
        Node::Select {
            operand,
            field,
            test,
        } => match (
            device_prop(&operand, &field, test),
            domain_of(&operand),
            &field,
        ) {
            (Some(p), _, _) => Node::DeviceProp(p),
            (_, Some((capacity, domain)), Value::Str(id)) => Node::DeviceField {
                capacity,
                domain,
                id: id.clone(),
                mode: if test { FieldMode::Has } else { FieldMode::Get },
            },
            _ => Node::Select {
                operand,
                field,
                test,
            },
        },
        Node::OptSelect { operand, field } => match (domain_of(&operand), &field) {
            (Some((capacity, domain)), Value::Str(id)) => Node::DeviceField {
                capacity,
                domain,
                id: id.clone(),
                mode: FieldMode::Opt,
            },
            _ => Node::OptSelect { operand, field },
        },
        Node::Call { func, args } if matches!(func, Func::Index | Func::OptIndex) => {
            match (domain_of(&args[0]), &args[1]) {
                (Some((capacity, domain)), Node::Const(Value::Str(id))) => Node::DeviceField {
                    capacity,
                    domain,
                    id: id.clone(),
                    mode: if func == Func::Index {
                        FieldMode::Get
                    } else {
                        FieldMode::Opt
                    },
                },
                _ => Node::Call { func, args },
            }
        }
        n => n,
    }
}

fn device_prop(operand: &Node, field: &Value, test: bool) -> Option<DeviceProp> {
    match (operand, field, test) {
        (Node::Device, Value::Str(f), false) => match f.as_ref() {
            "driver" => Some(DeviceProp::Driver),
            "allowMultipleAllocations" => Some(DeviceProp::AllowMultipleAllocations),
            _ => None,
        },
        _ => None,
    }
}

/// `device.attributes` (false) or `device.capacity` (true).
fn device_map(n: &Node) -> Option<bool> {
    match n {
        Node::Select {
            operand,
            field: Value::Str(f),
            test: false,
        } if matches!(**operand, Node::Device) => match f.as_ref() {
            "attributes" => Some(false),
            "capacity" => Some(true),
            _ => None,
        },
        _ => None,
    }
}

/// `device.<map>[domain]` or `device.<map>.domain`, with a constant domain.
fn domain_of(n: &Node) -> Option<(bool, Arc<str>)> {
    match n {
        Node::Call {
            func: Func::Index,
            args,
        } => match (device_map(&args[0]), &args[1]) {
            (Some(cap), Node::Const(Value::Str(d))) => Some((cap, d.clone())),
            _ => None,
        },
        Node::Select {
            operand,
            field: Value::Str(d),
            test: false,
        } => device_map(operand).map(|cap| (cap, d.clone())),
        _ => None,
    }
}

fn fuse_children(n: Node) -> Node {
    let b = |n: Box<Node>| Box::new(fuse(*n));
    match n {
        Node::Select {
            operand,
            field,
            test,
        } => Node::Select {
            operand: b(operand),
            field,
            test,
        },
        Node::OptSelect { operand, field } => Node::OptSelect {
            operand: b(operand),
            field,
        },
        Node::And(x, y) => Node::And(b(x), b(y)),
        Node::OrOp(x, y) => Node::OrOp(b(x), b(y)),
        Node::Cond(c, x, y) => Node::Cond(b(c), b(x), b(y)),
        Node::Call { func, args } => Node::Call {
            func,
            args: args.into_iter().map(fuse).collect(),
        },
        Node::List { elems, optional } => Node::List {
            elems: elems.into_iter().map(fuse).collect(),
            optional,
        },
        Node::Map { entries } => Node::Map {
            entries: entries
                .into_iter()
                .map(|(k, v, o)| (fuse(k), fuse(v), o))
                .collect(),
        },
        Node::Comp(c) => {
            let c = *c;
            Node::Comp(Box::new(Comp {
                range: fuse(c.range),
                init: fuse(c.init),
                cond: fuse(c.cond),
                step: fuse(c.step),
                result: fuse(c.result),
                ..c
            }))
        }
        Node::Bind { slot, init, body } => Node::Bind {
            slot,
            init: b(init),
            body: b(body),
        },
        Node::RegexCall { func, target, re } => Node::RegexCall {
            func,
            target: b(target),
            re,
        },
        Node::InSet { needle, set } => Node::InSet {
            needle: b(needle),
            set,
        },
        n @ (Node::Const(_)
        | Node::Device
        | Node::Local(_)
        | Node::DeviceProp(_)
        | Node::DeviceField { .. }) => n,
    }
}
