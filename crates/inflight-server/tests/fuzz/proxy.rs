//! The proxy: requests with hostile key headers, paths and forwarding or hop-by-hop headers, written raw
//! to a running proxy; and key templates as an operator could write them.

use std::time::Duration;

use inflight_server::config::Layered;
use inflight_server::proxy::KeyTemplates;
use inflight_server::ProxySettings;
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use serde::Deserialize;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::common::{self, Make, Memory};
use crate::fuzz_api::{check_answer, encode, segment};

/// One request through the proxy.
#[derive(Clone, Debug, Deserialize)]
pub(crate) struct Request {
    method: String,
    path: String,
    #[serde(default)]
    headers: Vec<(String, String)>,
    #[serde(default)]
    body: String,
}

/// A proxy (keys `t:{header:X-Tenant}` and `p:{path}`, limited under `/echo`) and its upstream.
pub(crate) struct Proxied {
    _upstream: common::Upstream,
    proxy: common::Server<inflight::MemoryStore>,
    http: reqwest::Client,
}

impl Proxied {
    pub(crate) async fn start() -> Self {
        let upstream = common::Upstream::start().await;
        let mut serve = common::limits(3, 10);
        serve.workers = Some(1);
        let short = Duration::from_millis(200);
        serve.connections.header_timeout = short;
        serve.connections.body_timeout = short;
        let mut settings = common::proxy_settings(&upstream.base, serve);
        settings.key = vec!["t:{header:X-Tenant}".into(), "p:{path}".into()];
        settings.limit_path = vec!["/echo".into()];
        let proxy = common::start_proxy(&settings, Memory::stores(&None)).await;
        Self {
            _upstream: upstream,
            proxy,
            http: reqwest::Client::new(),
        }
    }

    /// Sends `case` (and `Connection: close`) and checks the answer.
    pub(crate) async fn check(&self, case: Request) -> Result<(), TestCaseError> {
        let mut bytes = format!("{} {} HTTP/1.1\r\n", case.method, case.path).into_bytes();
        for (name, value) in &case.headers {
            bytes.extend_from_slice(format!("{name}: {value}\r\n").as_bytes());
        }
        let body = case.body.as_bytes();
        let framing = format!(
            "Content-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        );
        bytes.extend_from_slice(framing.as_bytes());
        bytes.extend_from_slice(body);
        let mut stream = common::raw::connect(&self.proxy.base).await;
        if stream.write_all(&bytes).await.is_err() {
            return Ok(());
        }
        let mut answer = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut answer));
        prop_assert!(read.await.is_ok(), "no answer within 5 s");
        // Whole and alone on its connection, every request gets an answer (a panic would give none).
        prop_assert!(!answer.is_empty(), "closed without an answer");
        let text = String::from_utf8_lossy(&answer).to_string();
        let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
        let status: u16 = head
            .get(9..12)
            .and_then(|code| code.parse().ok())
            .ok_or_else(|| TestCaseError::fail(format!("not an answer: {head:?}")))?;
        let head_request = case.method == "HEAD";
        // The upstream's own 404 is its text, not a refusal of the proxy's.
        if body != "no such route upstream" {
            check_answer(status, body.as_bytes(), head_request)?;
        }
        if status == 200 && !head_request {
            // The upstream's echo of what it got (the API's own answers under /_inflight are not).
            match serde_json::from_str::<Value>(body) {
                Ok(echo) if echo["headers"].is_object() => {
                    self.check_forwarded(&case, &echo).await?
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// What the upstream got: no hop-by-hop header, the client's claims about its address replaced; and
    /// the key the proxy admitted it under is one the API reads.
    async fn check_forwarded(&self, case: &Request, echo: &Value) -> Result<(), TestCaseError> {
        let headers = &echo["headers"];
        for gone in [
            "connection",
            "keep-alive",
            "te",
            "trailer",
            "upgrade",
            "proxy-authorization",
            "x-real-ip",
            "forwarded",
        ] {
            prop_assert!(
                headers.get(gone).is_none(),
                "{} reached the upstream: {}",
                gone,
                headers
            );
        }
        prop_assert_eq!(headers["x-forwarded-for"].as_str(), Some("127.0.0.1"));
        let tenants: Vec<&str> = case
            .headers
            .iter()
            .filter(|(name, _)| name.eq_ignore_ascii_case("x-tenant"))
            .map(|(_, value)| value.as_str())
            .collect();
        if let (true, [tenant]) = (
            echo["path"]
                .as_str()
                .is_some_and(|p| p.starts_with("/echo")),
            &tenants[..],
        ) {
            // hyper trims the value's surrounding whitespace, as the proxy read it.
            let key = format!("t:{}", tenant.trim_matches([' ', '\t']));
            let url = self
                .proxy
                .url(&format!("/_inflight/v1/keys/{}", encode(&key)));
            let read = self.http.get(url).send().await;
            let status = read
                .map_err(|e| TestCaseError::fail(e.to_string()))?
                .status();
            prop_assert_eq!(
                status.as_u16(),
                200,
                "the proxy admitted under {:?}, the API refuses it",
                key
            );
        }
        Ok(())
    }
}

/// Requests to the proxy: methods, paths under `/echo` and elsewhere, hostile headers.
pub(crate) fn requests() -> impl Strategy<Value = Request> {
    let method = prop_oneof![
        6 => prop::sample::select(&["GET", "POST", "PUT", "DELETE"][..]).prop_map(String::from),
        1 => prop::sample::select(&["HEAD", "OPTIONS", "PATCH", "TRACE", "CONNECT", "FROB"][..])
            .prop_map(String::from),
    ];
    let path = prop_oneof![
        4 => prop::collection::vec(segment(), 0..4)
            .prop_map(|segments| format!("/echo/{}", segments.join("/"))),
        1 => prop::sample::select(&[
            "/echo", "/ECHO/x", "//echo/x", "/echo/./x", "/echo/../x", "/%65cho/x", "/echo%2Fx",
            "/echo;x=1/y", "/\\echo/x", "/_inflight/v1/keys/k", "/elsewhere", "*", "/echo/x?y=%zz",
        ][..]).prop_map(String::from),
    ];
    let name = prop_oneof![
        4 => prop::sample::select(&[
            "X-Tenant", "x-tenant", "Authorization", "Connection", "Keep-Alive", "TE", "Trailer",
            "Upgrade", "Proxy-Authorization", "X-Forwarded-For", "X-Real-IP", "Forwarded",
            "X-Forwarded-Host", "Host", "Transfer-Encoding", "Expect", "Content-Type",
        ][..]).prop_map(String::from),
        1 => "[A-Za-z][A-Za-z0-9-]{0,12}",
    ];
    // Any value an HTTP/1 header line can carry (no CR or LF): tabs, spaces, obs-text, controls.
    let value = prop_oneof![
        4 => "[ -~]{0,24}",
        2 => "[ \t]{0,2}[a-z0-9:*-]{0,10}[ \t]{0,2}",
        1 => any::<String>().prop_map(|text| text.replace(['\r', '\n'], "")),
        1 => prop::sample::select(&["x-tenant", "close, x-tenant", "upgrade", "chunked", "1.2.3.4", "for=1.2.3.4", "Bearer t"][..])
            .prop_map(String::from),
    ];
    let headers = prop::collection::vec((name, value), 0..6);
    let body = prop_oneof![Just(String::new()), "[ -~]{0,40}"];
    (method, path, headers, body).prop_map(|(method, path, headers, body)| Request {
        method,
        path,
        headers,
        body,
    })
}

/// Key templates: text and placeholders, well-formed or not, up to 20 (more than a request may have).
pub(crate) fn templates() -> impl Strategy<Value = Vec<String>> {
    let piece = prop_oneof![
        3 => "[a-z:_-]{0,6}",
        2 => prop::sample::select(&[
            "{header:X-Tenant}", "{header:x-tenant}", "{header:Authorization}", "{header:Cookie}",
            "{header:Proxy-Authorization}", "{header:}", "{header:X Y}", "{header:é}", "{bearer_hash}",
            "{path}", "{client_ip}", "{", "}", "{}", "{unknown}", "{{path}}", "{header:a{b}",
        ][..]).prop_map(String::from),
        1 => "[ -~]{0,4}".prop_map(|text| text.replace(',', "")),
    ];
    let template = prop::collection::vec(piece, 0..4).prop_map(|pieces| pieces.concat());
    prop::collection::vec(template, 0..20)
}

/// Parsing templates never panics, and `--key` accepts exactly the templates the parser accepts.
pub(crate) fn check_templates(templates: Vec<String>) -> Result<(), TestCaseError> {
    let parsed = KeyTemplates::parse(templates.iter().map(String::as_str));
    if templates.is_empty() {
        prop_assert!(parsed.is_err(), "no templates parsed");
        return Ok(());
    }
    let mut flags = vec![
        "inflight".to_owned(),
        "--upstream".into(),
        "http://127.0.0.1:9".into(),
    ];
    for template in &templates {
        flags.push(format!("--key={template}"));
    }
    let settings = ProxySettings::from_flags(&flags);
    match (&parsed, &settings) {
        (Ok(_), Ok(_)) | (Err(_), Err(_)) => {}
        _ => prop_assert!(
            false,
            "the parser says {:?}, the flags {:?}",
            parsed.is_ok(),
            settings.as_ref().err()
        ),
    }
    if let Err(error) = settings {
        prop_assert!(!error.setting.is_empty());
    }
    Ok(())
}
