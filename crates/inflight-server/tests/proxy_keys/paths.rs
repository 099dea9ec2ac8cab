//! `--limit-path`: only the limited paths are limited, however they are spelt, and the path key is
//! the canonical path.

use reqwest::{Client, StatusCode};

use crate::common::{limits, wait_in_flight, Make};
use crate::per_store;
use crate::{code_of, get, proxied, raw_status, templates};

async fn only_the_limited_paths_are_limited_however_they_are_spelt<M: Make>() {
    let (_redis, upstream, server) = proxied::<M>(limits(1, 0), |s| {
        s.limit_path = vec!["/sse".to_owned(), "/echo/Limited".to_owned()];
    })
    .await;
    let http = Client::new();
    let key = [("x-inflight-key", "k")];
    let stream = get(&http, server.url("/sse"), &key).await;
    assert_eq!(stream.status(), StatusCode::OK);
    wait_in_flight(&server.url("/_inflight"), "k", 1).await;
    // Outside the prefixes: forwarded without a limit, and without a key.
    for path in ["/echo/x", "/echo/limitedx", "/echo"] {
        let response = get(&http, server.url(path), &key).await;
        assert_ne!(response.status(), StatusCode::TOO_MANY_REQUESTS, "{path}");
        let unkeyed = get(&http, server.url(path), &[]).await;
        assert_ne!(unkeyed.status(), StatusCode::BAD_REQUEST, "{path}");
    }
    let hits = upstream.hits();
    let free = get(&http, server.url("/ssex"), &key).await;
    assert_eq!(free.text().await.unwrap(), "no such route upstream");
    assert_eq!(upstream.hits(), hits + 1, "/ssex is not /sse");
    let hits = upstream.hits();
    let base = server.base.clone();
    let statuses = tokio::task::spawn_blocking(move || {
        let limited = [
            "/sse",
            "//sse",
            "/SSE",
            "/%73se",
            "/sse/",
            "/sse;x=1",
            "/%5Csse",
            "/echo/limited",
            "/echo/limited/abc/stop",
            "/echo//LIMITED/abc",
            "/echo%2Flimited",
        ];
        let dotted = [
            "/./sse",
            "/x/../sse",
            "/%2e/sse",
            "/x/%2E%2E/sse",
            "/echo/a/..;/limited",
        ];
        // Full (429) however the limited path is written; refused (400) with a dot segment.
        let limited = limited.map(|target| (target, 429));
        let dotted = dotted.map(|target| (target, 400));
        let raw: Vec<(&str, u16, u16)> = limited
            .iter()
            .chain(&dotted)
            .map(|&(target, want)| (target, want, raw_status(&base, target, "k")))
            .collect();
        raw
    })
    .await
    .unwrap();
    for (target, want, status) in statuses {
        assert_eq!(status, want, "{target}");
    }
    assert_eq!(upstream.hits(), hits, "no spelling got through");
    // A missing key on a limited path is still the default's 400.
    let unkeyed = get(&http, server.url("/echo/limited"), &[]).await;
    assert_eq!(code_of(unkeyed).await.1["code"], "missing_key");
    drop(stream);
    wait_in_flight(&server.url("/_inflight"), "k", 0).await;
}

/// `{path}`: the canonical path, so that no spelling of it makes a key of its own.
async fn the_path_key_is_the_canonical_path<M: Make>() {
    let (_redis, _upstream, server) = proxied::<M>(limits(1, 0), |s| {
        templates(s, &["route:{path}"]);
    })
    .await;
    let http = Client::new();
    let stream = get(&http, server.url("/sse"), &[]).await;
    assert_eq!(stream.status(), StatusCode::OK);
    wait_in_flight(&server.url("/_inflight"), "route:%2Fsse", 1).await;
    let base = server.base.clone();
    let statuses = tokio::task::spawn_blocking(move || {
        ["//sse", "/SSE/", "/x/../sse", "/echo/x"].map(|target| raw_status(&base, target, "-"))
    })
    .await
    .unwrap();
    assert_eq!(statuses, [429, 429, 400, 200]);
    drop(stream);
}

per_store!(
    only_the_limited_paths_are_limited_however_they_are_spelt,
    the_path_key_is_the_canonical_path,
);
