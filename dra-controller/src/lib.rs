//! `dra-controller`: the cluster controller (`run`) and the local DRA simulator (`eval`, `simulate`).

pub mod cli;
pub mod controller;
pub mod sim;
