//! Layering the settings' sources: the flags and the environment over the TOML file over the defaults, and
//! the reference system's variables standing in for unset `INFLIGHT_*` ones.

use std::path::Path;

use clap::parser::ValueSource;
use clap::{ArgMatches, Args};
use figment::providers::{Format, Serialized, Toml};
use figment::value::{Dict, Value};
use figment::Figment;
use serde::de::DeserializeOwned;
use serde::Serialize;

use super::{
    invalid, ConfigError, Connections, LoggingSettings, ProxySettings, RedisSettings, Settings,
};

/// `args` as parsed, with the file (if any) over the defaults and under the flags and the environment.
pub(super) fn layer<A: Serialize + DeserializeOwned>(
    args: &A,
    matches: &ArgMatches,
    file: Option<&Path>,
) -> Result<A, ConfigError> {
    let Ok(Value::Dict(_, mut parsed)) = Value::serialize(args) else {
        unreachable!("settings serialize to a dictionary");
    };
    let mut explicit: Dict = parsed
        .iter()
        .filter(|(id, _)| {
            matches!(
                matches.value_source(id),
                Some(ValueSource::CommandLine | ValueSource::EnvVariable)
            )
        })
        .map(|(id, value)| (id.clone(), value.clone()))
        .collect();
    // The reference system's variables stand in for unset `INFLIGHT_*` ones, at the environment's rank.
    for (id, var) in [
        ("default_limit", "APP_DEFAULT_ACTIVE_REQUESTS"),
        ("max_limit", "APP_MAX_ACTIVE_REQUESTS"),
    ] {
        if !explicit.contains_key(id) {
            if let Some(limit) = dify_alias(var)? {
                explicit.insert(id.to_owned(), limit.into());
            }
        }
    }
    // And Dify's REDIS_KEY_PREFIX for an unset --redis-key-prefix.
    if !explicit.contains_key("redis_key_prefix") {
        if let Ok(prefix) = std::env::var("REDIS_KEY_PREFIX") {
            // (Trimmed as Dify trims it by the store's builder, as a flag's value is.)
            explicit.insert("redis_key_prefix".to_owned(), prefix.into());
        }
    }
    // So do Dify's REDIS_* variables for an unset store, below the file.
    if !explicit.contains_key("store") {
        if let Some(url) = super::store::dify_store_url(|name| std::env::var(name).ok())? {
            parsed.insert("store".to_owned(), url.into());
        }
    }
    let mut figment = Figment::from(Serialized::defaults(parsed));
    if let Some(path) = file {
        check_keys(&file_keys(path)?)?;
        figment = figment.merge(Toml::file(path));
    }
    let figment = figment.merge(Serialized::defaults(explicit));
    figment.extract().map_err(|e| {
        // The proxy's settings flatten serve's, which flatten the connections', whose errors then come
        // without their path: ask again for each alone, which names the setting.
        let e = named::<Settings>(&figment, e);
        let e = named::<Connections>(&figment, e);
        let e = named::<RedisSettings>(&figment, e);
        let e = named::<LoggingSettings>(&figment, e);
        let setting = e.path.last().map_or("config", String::as_str);
        invalid(setting, e.kind)
    })
}

/// `e`, or when it names no setting, the error of extracting `T` alone, if that names one.
fn named<T: DeserializeOwned>(figment: &Figment, e: figment::Error) -> figment::Error {
    match (e.path.is_empty(), figment.extract::<T>()) {
        (true, Err(named)) => named,
        _ => e,
    }
}

/// The keys the TOML file at `path` sets.
pub(super) fn file_keys(path: &Path) -> Result<Dict, ConfigError> {
    if !path.exists() {
        let reason = format!("{} does not exist", path.display());
        return Err(invalid("config", reason));
    }
    Figment::from(Toml::file(path))
        .extract()
        .map_err(|e| invalid("config", e))
}

/// Refuses a key of the file that is no setting of any command (a misspelt one, say).
fn check_keys(keys: &Dict) -> Result<(), ConfigError> {
    let command = ProxySettings::augment_args(clap::Command::new("inflight"));
    let known: Vec<&str> = command
        .get_arguments()
        .map(|a| a.get_id().as_str())
        .collect();
    match keys
        .keys()
        .find(|key| key.as_str() == "config" || !known.contains(&key.as_str()))
    {
        Some(key) => Err(invalid(key, "no such setting")),
        None => Ok(()),
    }
}

fn dify_alias(var: &str) -> Result<Option<u32>, ConfigError> {
    match std::env::var(var) {
        Err(_) => Ok(None),
        Ok(text) if text.trim().is_empty() => Ok(None),
        Ok(text) => text
            .trim()
            .parse()
            .map(Some)
            .map_err(|_| invalid(var, format!("{text:?} is not a whole number >= 0"))),
    }
}
