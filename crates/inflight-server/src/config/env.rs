//! Errors in values that came from the environment name the variable, not only the flag it stands for.

use clap::error::{ContextKind, ContextValue, ErrorKind};
use clap::CommandFactory;

use super::Cli;

/// The command line and the environment, parsed; on a bad value taken from an `INFLIGHT_*` variable,
/// the error says which variable held it. Exits (as clap does) on an error, `--help` or `--version`.
pub fn parse() -> (Cli, clap::ArgMatches) {
    let command = Cli::command();
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let matches = match command.clone().try_get_matches_from(&args) {
        Ok(matches) => matches,
        Err(error) => fail(&command, &args, error),
    };
    match <Cli as clap::FromArgMatches>::from_arg_matches(&matches) {
        Ok(cli) => (cli, matches),
        Err(error) => fail(&command, &args, error),
    }
}

fn fail(command: &clap::Command, args: &[std::ffi::OsString], error: clap::Error) -> ! {
    match from_variable(command, args, &error) {
        Some(text) => {
            eprint!("{text}");
            std::process::exit(2)
        }
        None => error.exit(),
    }
}

/// The error's text naming the variable, when the bad value came from one (not from the flag).
pub fn from_variable(
    command: &clap::Command,
    args: &[std::ffi::OsString],
    error: &clap::Error,
) -> Option<String> {
    if !matches!(
        error.kind(),
        ErrorKind::InvalidValue | ErrorKind::ValueValidation
    ) {
        return None;
    }
    let Some(ContextValue::String(shown)) = error.get(ContextKind::InvalidArg) else {
        return None;
    };
    let long = shown.strip_prefix("--")?.split([' ', '=']).next()?;
    let on_line = args.iter().any(|arg| {
        let arg = arg.to_string_lossy();
        arg == format!("--{long}") || arg.starts_with(&format!("--{long}="))
    });
    if on_line {
        return None;
    }
    let variable = command
        .get_subcommands()
        .flat_map(|sub| sub.get_arguments())
        .chain(command.get_arguments())
        .find(|arg| arg.get_long() == Some(long))?
        .get_env()?
        .to_string_lossy()
        .into_owned();
    std::env::var_os(&variable)?;
    let text = error.render().to_string();
    let quoted = format!("'{shown}'");
    Some(text.replacen(
        &quoted,
        &format!("{quoted} in the environment variable {variable}"),
        1,
    ))
}
