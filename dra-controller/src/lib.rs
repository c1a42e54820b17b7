//! `dra-controller`: the cluster controller (`run`), the admission webhook (`webhook`) and the
//! commands of the local DRA simulator (`eval`, `simulate`, from the `dra-sim` crate).

pub mod cli;
pub mod controller;
pub mod webhook;
