//! `inflight check-config FILE`: the file's settings, loaded as the command would load them at start.

use std::path::PathBuf;

use clap::Args;

use super::{layer, ConfigError, Layered, ProxySettings, Settings};

/// The arguments of `inflight check-config`.
#[derive(Debug, Args)]
pub struct CheckArgs {
    /// The TOML file to check.
    #[arg(value_name = "FILE")]
    pub file: PathBuf,
    /// Check it as `inflight proxy`'s settings (the default when the file sets `upstream`).
    #[arg(long)]
    pub proxy: bool,
}

/// Loads the file as `inflight serve` (or `proxy`) would, with the environment and checks included;
/// the command it was checked for, or the first setting that is wrong and why.
pub fn check(args: &CheckArgs) -> Result<&'static str, ConfigError> {
    let file = args.file.as_os_str();
    let proxy = args.proxy || layer::file_keys(&args.file)?.contains_key("upstream");
    let flags = [std::ffi::OsStr::new("inflight"), "--config".as_ref(), file];
    if proxy {
        ProxySettings::from_flags(flags).map(|_| "proxy")
    } else {
        Settings::from_flags(flags).map(|_| "serve")
    }
}
