//! Logging for `dra-plugin` and `dra-controller`, configured the way Kubernetes components are:
//! `-v N` / `--v N` and `--logging-format text|json`, with environment fallbacks a Helm chart can
//! set, mapped onto `tracing` levels per crate. `RUST_LOG`, when set, replaces the level mapping.
//! Logs go to stderr; colour only on a terminal and never with `NO_COLOR`.
use std::io::IsTerminal;

use clap::{Args, ValueEnum};
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer, Registry};

/// Fallback for `-v` (the variable NVIDIA's chart sets for its binaries' `-v`).
pub const VERBOSITY_ENV: &str = "LOG_VERBOSITY";
/// Fallback for `--logging-format` (what component-base's flag is called as a variable).
pub const FORMAT_ENV: &str = "LOGGING_FORMAT";
/// `tracing` directives (`warn,dra_plugin::grpc=trace`) that replace the verbosity mapping.
pub const FILTER_ENV: &str = "RUST_LOG";
/// <https://no-color.org>: set and not empty turns colour off.
pub const NO_COLOR_ENV: &str = "NO_COLOR";

/// The `tracing` targets of this workspace's crates; everything else counts as a dependency.
const OWN_CRATES: &[&str] = &[
    "dra_plugin",
    "dra_controller",
    "dra_sim",
    "gpu_dra_api",
    "gpu_dra_log",
    "kubelet_proto",
    "sim_bench",
];

/// The logging flags, global so they go before or after the subcommand.
#[derive(Args, Debug, Clone, Default, PartialEq, Eq)]
pub struct LogArgs {
    /// Log verbosity, as Kubernetes components take it: 0-1 info, 2-4 debug, 5 and up trace for
    /// this driver; libraries one step quieter. Env: LOG_VERBOSITY. RUST_LOG, when set, replaces
    /// this mapping.
    #[arg(short = 'v', long = "v", global = true, value_name = "N")]
    pub verbosity: Option<u32>,
    /// Log format: text, or json (one object per line). Env: LOGGING_FORMAT.
    #[arg(long, global = true, value_enum, value_name = "FORMAT")]
    pub logging_format: Option<Format>,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum Format {
    #[default]
    Text,
    Json,
}

impl Format {
    /// The flag's spelling, for passing the format on to another process.
    pub fn as_str(self) -> &'static str {
        match self {
            Format::Text => "text",
            Format::Json => "json",
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{VERBOSITY_ENV}={0:?} is not a verbosity (a whole number from 0)")]
    Verbosity(String),
    #[error("{FORMAT_ENV}={0:?} is not a logging format (text or json)")]
    Format(String),
    #[error("{FILTER_ENV}={value:?}: {source}")]
    Filter {
        value: String,
        #[source]
        source: tracing_subscriber::filter::ParseError,
    },
    #[error("a global logger is already installed")]
    AlreadySet(#[source] tracing_subscriber::util::TryInitError),
}

/// The settled logging configuration: flags first, then the environment, then defaults.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    pub verbosity: u32,
    pub format: Format,
    /// `RUST_LOG`'s directives, used instead of [`directives`]`(verbosity)`.
    pub filter: Option<String>,
    pub colour: bool,
}

/// An unset variable and an empty one mean the same: a chart writes `value: ""` for unset values.
fn non_empty(value: Option<String>) -> Option<String> {
    value.filter(|v| !v.trim().is_empty())
}

impl Config {
    /// `env` looks variables up (the process environment in [`init`]; a map in tests).
    pub fn resolve(
        args: &LogArgs,
        env: impl Fn(&str) -> Option<String>,
        stderr_is_terminal: bool,
    ) -> Result<Self, Error> {
        let verbosity = match (args.verbosity, non_empty(env(VERBOSITY_ENV))) {
            (Some(v), _) => v,
            (None, Some(s)) => s.trim().parse().map_err(|_| Error::Verbosity(s))?,
            (None, None) => 0,
        };
        let format = match (args.logging_format, non_empty(env(FORMAT_ENV))) {
            (Some(f), _) => f,
            (None, Some(s)) => Format::from_str(s.trim(), true).map_err(|_| Error::Format(s))?,
            (None, None) => Format::Text,
        };
        let colour =
            format == Format::Text && stderr_is_terminal && non_empty(env(NO_COLOR_ENV)).is_none();
        Ok(Config {
            verbosity,
            format,
            filter: non_empty(env(FILTER_ENV)),
            colour,
        })
    }

    /// The filter this configuration logs through.
    pub fn env_filter(&self) -> Result<EnvFilter, Error> {
        let directives = self
            .filter
            .clone()
            .unwrap_or_else(|| directives(self.verbosity));
        EnvFilter::builder()
            .parse(&directives)
            .map_err(|source| Error::Filter {
                value: directives,
                source,
            })
    }
}

/// klog's verbosity on `tracing` levels: this workspace's crates at the level, dependencies (h2,
/// hyper, tower, kube, rustls, ...) one step quieter, so `-v 4` debugs the driver, not the HTTP
/// stack.
pub fn directives(verbosity: u32) -> String {
    let (own, deps) = match verbosity {
        0..=1 => ("info", "warn"),
        2..=4 => ("debug", "info"),
        _ => ("trace", "debug"),
    };
    let mut out = deps.to_string();
    for c in OWN_CRATES {
        out.push_str(&format!(",{c}={own}"));
    }
    out
}

/// The formatting layer for `config`, writing to `writer`.
fn fmt_layer<W>(config: &Config, writer: W) -> Box<dyn Layer<Registry> + Send + Sync>
where
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    let layer = tracing_subscriber::fmt::layer().with_writer(writer);
    match config.format {
        Format::Text => Box::new(layer.with_ansi(config.colour)),
        // Event fields at the top level next to `message`; the current span's fields under
        // `span`, every enclosing span's under `spans`.
        Format::Json => Box::new(
            layer
                .json()
                .flatten_event(true)
                .with_current_span(true)
                .with_span_list(true),
        ),
    }
}

/// A subscriber for `config` writing to `writer` (tests capture it; [`init`] uses stderr).
pub fn subscriber<W>(
    config: &Config,
    writer: W,
) -> Result<impl tracing::Subscriber + Send + Sync, Error>
where
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    Ok(tracing_subscriber::registry()
        .with(fmt_layer(config, writer))
        .with(config.env_filter()?))
}

/// Installs the process-wide logger from flags and environment; call once, first thing in `main`.
pub fn init(args: &LogArgs) -> Result<Config, Error> {
    let config = Config::resolve(
        args,
        |k| std::env::var(k).ok(),
        std::io::stderr().is_terminal(),
    )?;
    subscriber(&config, std::io::stderr)?
        .try_init()
        .map_err(Error::AlreadySet)?;
    Ok(config)
}

/// Reports the error a binary exits with: as a JSON log line under `--logging-format json` (so
/// a log pipeline parses the last line too), else the way `anyhow` prints it from `main`.
pub fn exit_error<E: std::fmt::Debug + std::fmt::Display>(format: Format, error: &E) {
    match format {
        Format::Json => tracing::error!(error = %format_args!("{error:#}"), "exiting"),
        Format::Text => eprintln!("Error: {error:?}"),
    }
}

#[cfg(test)]
mod tests;
