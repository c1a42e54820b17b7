//! The scheduler's structured allocator (`k8s.io/dynamic-resource-allocation/structured`, the
//! "incubating" variant the 1.37 scheduler uses with its default feature gates): pool gathering,
//! first-fit depth-first search with full backtracking over all claims of a pod, `firstAvailable`,
//! `All`, admin access, constraints, shared counters, taints, consumable capacity.
//!
//! The search mirrors the upstream control flow step by step (same order of checks, same lazy CEL
//! evaluation), so the first solution found and the errors raised are the scheduler's.
//!
//! One module per phase, each using only those listed before it: `types` (the shared
//! vocabulary), `facts` (what is known of the slices before any claim), `allocator` (the slices,
//! classes and caches), `pools` (pool gathering), `capacity`, `constraints` and `taints` (checks
//! on one device), `run` (one attempt on one node and its per-device checks), `prepare` (requests
//! and constraints normalized), `counters` (shared counters), `results` (the `AllocationResult`s),
//! `search` (the entry point [`Allocator::allocate`]), `explain` ([`Allocator::explain`]) and
//! `memo` (what a run over many pods keeps between calls).
mod allocator;
pub mod capacity;
mod constraints;
mod counters;
pub mod explain;
mod facts;
mod memo;
mod pools;
mod prepare;
mod results;
mod run;
mod search;
mod taints;
mod types;

pub use allocator::{AllocatedState, Allocator};
pub use facts::{DeviceCache, SliceFacts};
pub use memo::Kept;
pub use pools::{Pool, node_matches};
pub(crate) use types::claim_name;
pub use types::{ALLOCATION_RESULTS_MAX_SIZE, DevRef, DeviceId, Outcome, SimNode};
