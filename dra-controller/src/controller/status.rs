//! GPUCluster status as a pure function of the pool plan and the plugin DaemonSet's status.
use gpu_dra_api::names::{DEVICE_PLUGIN_LABEL, GPU_RESOURCE};
use k8s_openapi::api::apps::v1::DaemonSetStatus;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;

use super::crd::{GPUClusterStatus, State};
use super::pool::PoolPlan;

pub const READY: &str = "Ready";
pub const POOL_CONFLICT: &str = "PoolConflict";
/// At most this many node names are listed in status; the counts are always complete.
pub const MAX_LISTED_NODES: usize = 50;

pub struct Inputs<'a> {
    pub plan: &'a PoolPlan,
    pub daemonset: Option<&'a DaemonSetStatus>,
    pub namespace: &'a str,
    pub generation: Option<i64>,
    pub previous: &'a [Condition],
    pub now: Timestamp,
}

pub fn compute(i: &Inputs<'_>) -> GPUClusterStatus {
    let conflicting = i.plan.conflicting();
    let (desired, ready) = i
        .daemonset
        .map_or((0, 0), |s| (s.desired_number_scheduled, s.number_ready));
    let pool = i.plan.pool_nodes();
    let state = if pool == 0 {
        State::Disabled
    } else if conflicting.is_empty()
        && ready == desired
        // a negative count (never a real one) is not "every node"
        && usize::try_from(desired).is_ok_and(|d| d >= i.plan.ready_nodes())
    {
        State::Ready
    } else {
        State::NotReady
    };
    let (ready_status, ready_reason, ready_msg) = match state {
        State::Ready => (
            "True",
            "OperandsReady",
            format!("the kubelet plugin runs on all {pool} pool nodes"),
        ),
        State::Disabled => (
            "False",
            "EmptyPool",
            "the migration pool selects no nodes".to_owned(),
        ),
        State::NotReady => (
            "False",
            "OperandNotReady",
            format!(
                "{ready} of {desired} kubelet-plugin pods ready; {} pool nodes in conflict",
                conflicting.len()
            ),
        ),
    };
    let conflict = if conflicting.is_empty() {
        (
            "False",
            "NoConflict",
            "no pool node advertises the device plugin's resource".to_owned(),
        )
    } else {
        (
            "True",
            "DevicePluginStillAdvertises",
            format!(
                "{} pool node(s) still advertise {GPU_RESOURCE} from a device plugin and get no DRA plugin ({}): \
                 make sure the device plugin honours {DEVICE_PLUGIN_LABEL}=false or remove it from these nodes, \
                 and move GPU pods off them; the DRA plugin follows once {GPU_RESOURCE} is gone from allocatable",
                conflicting.len(),
                shorten(&conflicting).join(", ")
            ),
        )
    };
    let conditions = vec![
        condition(i, READY, ready_status, ready_reason, ready_msg),
        condition(i, POOL_CONFLICT, conflict.0, conflict.1, conflict.2),
    ];
    GPUClusterStatus {
        state: Some(state),
        namespace: Some(i.namespace.to_owned()),
        observed_generation: i.generation,
        pool_nodes: count(pool),
        ready_nodes: count(i.plan.ready_nodes()),
        conflicting_nodes: shorten(&conflicting),
        draining_nodes: shorten(&i.plan.draining()),
        conditions,
    }
}

/// A node count in status (an `int32` there): no cluster has `i32::MAX` nodes.
fn count(n: usize) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

fn shorten(names: &[String]) -> Vec<String> {
    names.iter().take(MAX_LISTED_NODES).cloned().collect()
}

/// Keep the previous transition time while the status stays the same.
fn condition(
    i: &Inputs<'_>,
    type_: &str,
    status: &str,
    reason: &str,
    message: String,
) -> Condition {
    let since = i
        .previous
        .iter()
        .find(|c| c.type_ == type_ && c.status == status)
        .map_or(Time(i.now), |c| c.last_transition_time.clone());
    Condition {
        type_: type_.to_owned(),
        status: status.to_owned(),
        reason: reason.to_owned(),
        message,
        observed_generation: i.generation,
        last_transition_time: since,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::pool::{NodeFacts, plan, pool_selector};

    fn facts(name: &str, advertises: bool) -> NodeFacts {
        NodeFacts {
            name: name.into(),
            labels: [("nvidia.com/gpu.present".to_string(), "true".to_string())].into(),
            advertises_gpu: advertises,
            ..Default::default()
        }
    }

    fn ds(desired: i32, ready: i32) -> DaemonSetStatus {
        DaemonSetStatus {
            desired_number_scheduled: desired,
            number_ready: ready,
            ..Default::default()
        }
    }

    fn run(
        plan: &PoolPlan,
        ds: Option<&DaemonSetStatus>,
        previous: &[Condition],
    ) -> GPUClusterStatus {
        compute(&Inputs {
            plan,
            daemonset: ds,
            namespace: "ns",
            generation: Some(3),
            previous,
            now: Timestamp::from_second(1_000).unwrap(),
        })
    }

    fn cond<'a>(s: &'a GPUClusterStatus, t: &str) -> &'a Condition {
        s.conditions.iter().find(|c| c.type_ == t).unwrap()
    }

    #[test]
    fn all_plugins_ready_is_ready() {
        let p = plan(
            &pool_selector(None).unwrap(),
            &[facts("a", false), facts("b", false)],
        );
        let s = run(&p, Some(&ds(2, 2)), &[]);
        assert_eq!(s.state, Some(State::Ready));
        assert_eq!((s.pool_nodes, s.ready_nodes), (2, 2));
        assert_eq!(cond(&s, READY).status, "True");
        assert_eq!(cond(&s, POOL_CONFLICT).status, "False");
        assert_eq!(s.namespace.as_deref(), Some("ns"));
        assert_eq!(s.observed_generation, Some(3));
    }

    #[test]
    fn a_negative_desired_count_is_not_ready() {
        // `desired as usize` read -1 as every node
        let p = plan(&pool_selector(None).unwrap(), &[facts("a", false)]);
        let s = run(&p, Some(&ds(-1, -1)), &[]);
        assert_eq!(s.state, Some(State::NotReady));
    }

    #[test]
    fn pods_not_ready_is_not_ready() {
        let p = plan(
            &pool_selector(None).unwrap(),
            &[facts("a", false), facts("b", false)],
        );
        let s = run(&p, Some(&ds(2, 1)), &[]);
        assert_eq!(s.state, Some(State::NotReady));
        assert_eq!(cond(&s, READY).reason, "OperandNotReady");
    }

    #[test]
    fn conflict_is_reported_with_what_to_do() {
        let p = plan(
            &pool_selector(None).unwrap(),
            &[facts("a", false), facts("b", true)],
        );
        let s = run(&p, Some(&ds(1, 1)), &[]);
        assert_eq!(s.state, Some(State::NotReady));
        assert_eq!(s.conflicting_nodes, ["b"]);
        let c = cond(&s, POOL_CONFLICT);
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            ("True", "DevicePluginStillAdvertises")
        );
        assert!(
            c.message.contains("(b)")
                && c.message
                    .contains("nvidia.com/gpu.deploy.device-plugin=false")
        );
    }

    #[test]
    fn empty_pool_is_disabled() {
        let p = plan(&pool_selector(None).unwrap(), &[]);
        assert_eq!(run(&p, None, &[]).state, Some(State::Disabled));
    }

    #[test]
    fn transition_time_is_kept_while_status_is_unchanged() {
        let p = plan(&pool_selector(None).unwrap(), &[facts("a", false)]);
        let first = run(&p, Some(&ds(1, 1)), &[]);
        let mut earlier = first.conditions.clone();
        for c in &mut earlier {
            c.last_transition_time = Time(Timestamp::from_second(5).unwrap());
        }
        let again = run(&p, Some(&ds(1, 1)), &earlier);
        assert_eq!(
            cond(&again, READY).last_transition_time,
            Time(Timestamp::from_second(5).unwrap())
        );
        let flipped = run(&p, Some(&ds(1, 0)), &earlier);
        assert_eq!(
            cond(&flipped, READY).last_transition_time,
            Time(Timestamp::from_second(1_000).unwrap())
        );
    }

    #[test]
    fn listed_names_are_bounded() {
        let nodes: Vec<_> = (0..(MAX_LISTED_NODES + 5))
            .map(|i| facts(&format!("n{i:03}"), true))
            .collect();
        let p = plan(&pool_selector(None).unwrap(), &nodes);
        let s = run(&p, None, &[]);
        assert_eq!(s.conflicting_nodes.len(), MAX_LISTED_NODES);
        assert_eq!(usize::try_from(s.pool_nodes), Ok(MAX_LISTED_NODES + 5));
    }
}
