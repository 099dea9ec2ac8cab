//! What a request carries, checked: keys and ids (in a path, a body, the proxy's key header), JSON
//! bodies, leases and waits, idempotency keys, and query strings.

use std::time::Duration;

use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, PathRejection};
use axum::extract::Path;
use axum::http::{HeaderMap, StatusCode, Uri};
use inflight::quota::IdempotencyKey;
use inflight::{AcquireOptions, PermitId, RemoteLease};
use serde::de::DeserializeOwned;

use crate::config::{MAX_LEASE, MIN_LEASE};
use crate::error::ApiError;

/// Longest key and id, in bytes.
const MAX_NAME: usize = 256;

/// Checks a key or a permit id, wherever it comes from (a path, a body, the proxy's key header): non-empty,
/// at most 256 bytes, no control characters.
pub fn check_name(name: &str) -> Result<(), &'static str> {
    if name.is_empty() {
        Err("Keys and ids may not be empty.")
    } else if name.len() > MAX_NAME {
        Err("Keys and ids are at most 256 bytes.")
    } else if name.chars().any(char::is_control) {
        Err("Keys and ids may not contain control characters.")
    } else {
        Ok(())
    }
}

/// A key from the path: non-empty, at most 256 bytes, no control characters.
pub(super) fn checked_key(path: Result<Path<String>, PathRejection>) -> Result<String, ApiError> {
    let Path(key) = path.map_err(|_| ApiError::invalid_key("The key is not valid UTF-8."))?;
    check_name(&key).map_err(ApiError::invalid_key)?;
    Ok(key)
}

/// The key and the id of a `.../{key}/.../{id}` path, checked.
pub(super) fn checked_key_and_id(
    path: Result<Path<(String, String)>, PathRejection>,
) -> Result<(String, String), ApiError> {
    let Path((key, id)) =
        path.map_err(|_| ApiError::invalid_key("The key or id is not valid UTF-8."))?;
    check_name(&key).map_err(ApiError::invalid_key)?;
    check_name(&id).map_err(ApiError::invalid_request)?;
    Ok((key, id))
}

/// A lent permit's id and, when its path names it, its key.
type Named = (PermitId, Option<String>);

/// The path of a lent permit: `/v1/keys/{key}/permits/{id}` names its key, `/v1/permits/{id}` its id
/// alone (its keys are recorded under it).
pub(super) trait PermitPath: DeserializeOwned + Send + 'static {
    /// The permit's id and key, checked.
    fn checked(path: Result<Path<Self>, PathRejection>) -> Result<Named, ApiError>;
}

impl PermitPath for (String, String) {
    fn checked(path: Result<Path<Self>, PathRejection>) -> Result<Named, ApiError> {
        let (key, id) = checked_key_and_id(path)?;
        Ok((PermitId::from(id), Some(key)))
    }
}

impl PermitPath for String {
    fn checked(path: Result<Path<Self>, PathRejection>) -> Result<Named, ApiError> {
        let Path(id) = path.map_err(|_| ApiError::invalid_request("The id is not valid UTF-8."))?;
        check_name(&id).map_err(ApiError::invalid_request)?;
        Ok((PermitId::from(id), None))
    }
}

/// The lease a path names, of the admission `token`.
pub(super) fn remote(id: PermitId, key: Option<&str>, token: u64) -> RemoteLease {
    match key {
        Some(key) => RemoteLease::new(&[key], id, token),
        None => RemoteLease::recorded(id, token),
    }
}

/// A JSON body; an empty body is the defaults.
pub(super) fn body<T: DeserializeOwned + Default>(
    bytes: Result<Bytes, BytesRejection>,
) -> Result<T, ApiError> {
    let bytes = bytes.map_err(|e| ApiError::unreadable_body(&e))?;
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    serde_json::from_slice(&bytes)
        .map_err(|e| ApiError::invalid_request(format!("Malformed JSON body: {e}")))
}

/// A lease asked for (`lease_ms`; none: the default), checked: from [`MIN_LEASE`] (shorter ones lapse
/// before their renewal comes) to [`MAX_LEASE`].
pub(super) fn lease(lease_ms: Option<u64>) -> Result<Option<Duration>, ApiError> {
    match lease_ms.map(Duration::from_millis) {
        Some(lease) if !(MIN_LEASE..=MAX_LEASE).contains(&lease) => {
            Err(ApiError::invalid_request(format!(
                "lease_ms must be between {} and {}.",
                MIN_LEASE.as_millis(),
                MAX_LEASE.as_millis()
            )))
        }
        lease => Ok(lease),
    }
}

/// A body's `field`, in ms, checked: from 1 ms to `max` (none: the default).
pub(super) fn millis(
    field: &str,
    ms: Option<u64>,
    max: Duration,
) -> Result<Option<Duration>, ApiError> {
    match ms {
        Some(ms) if ms == 0 || Duration::from_millis(ms) > max => Err(ApiError::invalid_request(
            format!("{field} must be between 1 and {}.", max.as_millis()),
        )),
        ms => Ok(ms.map(Duration::from_millis)),
    }
}

/// The longest an acquire body may ask to wait for a slot (`wait_ms`), as `--max-wait` at most.
pub const MAX_WAIT: Duration = Duration::from_secs(300);

/// How long an acquire may wait (`wait_ms`; none: not at all).
pub(super) fn wait(wait_ms: Option<u64>) -> Result<Duration, ApiError> {
    let wait = Duration::from_millis(wait_ms.unwrap_or(0));
    if wait > MAX_WAIT {
        return Err(ApiError::invalid_request(
            "wait_ms must be between 0 and 300000.",
        ));
    }
    Ok(wait)
}

pub(super) fn options(
    id: Option<String>,
    weight: Option<u32>,
    lease_ms: Option<u64>,
) -> Result<AcquireOptions, ApiError> {
    let mut options = AcquireOptions::new();
    if let Some(id) = id {
        check_name(&id).map_err(ApiError::invalid_request)?;
        options = options.id(id);
    }
    if let Some(weight) = weight {
        if weight == 0 {
            return Err(ApiError::invalid_request("weight must be at least 1."));
        }
        options = options.weight(weight);
    }
    if let Some(lease) = lease(lease_ms)? {
        options = options.lease(lease);
    }
    Ok(options)
}

/// The label of a permit (`"holder"`), listed with its lease or ticket: 1 to 128 bytes without control
/// characters.
pub(super) fn holder(
    options: AcquireOptions,
    holder: Option<String>,
) -> Result<AcquireOptions, ApiError> {
    let Some(holder) = holder else {
        return Ok(options);
    };
    if holder.is_empty()
        || holder.len() > inflight::store::MAX_HOLDER_LEN
        || holder.chars().any(char::is_control)
    {
        return Err(ApiError::invalid_request(
            "holder must be 1 to 128 bytes without control characters.",
        ));
    }
    Ok(options.holder(holder))
}

/// A waiter's place in a key's queue (`"priority"`, one of `levels` unless it is empty; `"flow"` and
/// `"flow_weight"`), beside `wait_ms`.
pub(super) fn queue(
    options: AcquireOptions,
    (priority, flow, flow_weight): (Option<u8>, Option<String>, Option<u32>),
    levels: &[u8],
) -> Result<AcquireOptions, ApiError> {
    let priority = priority.unwrap_or(0);
    if !levels.is_empty() && !levels.contains(&priority) {
        let why = format!("priority {priority} is not one of the configured levels {levels:?}.");
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_priority",
            why,
        ));
    }
    let mut options = options.priority(priority);
    if let Some(flow) = flow {
        if flow.len() > inflight::MAX_FLOW_LEN {
            return Err(ApiError::invalid_request("flow must be at most 256 bytes."));
        }
        options = options.flow(flow);
    }
    if let Some(weight) = flow_weight {
        if !(1..=inflight::MAX_FLOW_WEIGHT).contains(&weight) {
            return Err(ApiError::invalid_request("flow_weight must be 1 to 1000."));
        }
        options = options.flow_weight(weight);
    }
    Ok(options)
}

/// The request's `Idempotency-Key` header (IETF draft "The Idempotency-Key HTTP Header Field"): a
/// Structured Field string (`"..."`, with `\"` and `\\` escapes) as the draft has it, or the bare
/// value (visible ASCII) as many clients send it; 1 to 256 bytes. `None` when absent.
pub(super) fn idempotency_key(headers: &HeaderMap) -> Result<Option<IdempotencyKey>, ApiError> {
    let invalid = || {
        ApiError::invalid_request(
            "Idempotency-Key must be one header, a string of 1 to 256 bytes of visible ASCII \
             (\"quoted\", as the draft has it, or bare).",
        )
    };
    let mut values = headers.get_all("idempotency-key").iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(invalid());
    }
    let bytes = value.as_bytes();
    let key = match bytes.strip_prefix(b"\"") {
        Some(quoted) => unquote(quoted).ok_or_else(invalid)?,
        None if bytes.iter().all(u8::is_ascii_graphic) => bytes.to_vec(),
        None => return Err(invalid()),
    };
    match String::from_utf8(key) {
        Ok(key) if !key.is_empty() && key.len() <= MAX_NAME => Ok(Some(IdempotencyKey::from(key))),
        _ => Err(invalid()),
    }
}

/// The inside of a Structured Field string after its opening quote, which must end it; `None` if it is
/// not one.
fn unquote(quoted: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(quoted.len());
    let mut bytes = quoted.iter();
    while let Some(&byte) = bytes.next() {
        match byte {
            b'"' => return bytes.next().is_none().then_some(out),
            b'\\' => match bytes.next() {
                Some(&escaped @ (b'"' | b'\\')) => out.push(escaped),
                _ => return None,
            },
            b' '..=b'~' => out.push(byte),
            _ => return None,
        }
    }
    None
}

/// The query's `name=value` pairs, percent-decoded (`+` is a space).
pub fn query(uri: &Uri) -> Result<Vec<(String, String)>, ApiError> {
    let decode = |text: &str| {
        let text = text.replace('+', " ");
        percent_encoding::percent_decode_str(&text)
            .decode_utf8()
            .map(|text| text.into_owned())
            .map_err(|_| ApiError::invalid_request("The query is not valid UTF-8."))
    };
    uri.query()
        .unwrap_or_default()
        .split('&')
        .filter(|pair| !pair.is_empty())
        .map(|pair| {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            Ok((decode(name)?, decode(value)?))
        })
        .collect()
}
