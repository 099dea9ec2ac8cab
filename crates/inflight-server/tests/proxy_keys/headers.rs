//! Keys formed from headers by templates, a tenant's key over its apps, and missing or duplicated
//! key headers.

use reqwest::{Client, StatusCode};

use crate::common::{limits, metric, wait_in_flight, Make};
use crate::per_store;
use crate::{code_of, get, proxied, templates};

async fn a_full_tenant_refuses_every_app_of_it_at_once<M: Make>() {
    let (_redis, upstream, server) = proxied::<M>(limits(10, 0), |s| {
        templates(
            s,
            &[
                "tenant:{header:X-Tenant-Id}",
                "app:{header:X-App-Id}",
                "global",
            ],
        );
    })
    .await;
    let http = Client::new();
    let api = server.url("/_inflight");
    let set = http
        .put(server.url("/_inflight/v1/keys/tenant:acme/limit"))
        .json(&serde_json::json!({"limit": 2}))
        .send()
        .await
        .unwrap();
    assert_eq!(set.status(), StatusCode::OK);
    let acme = |app: &'static str| [("x-tenant-id", "acme"), ("x-app-id", app)];
    let a = get(&http, server.url("/sse"), &acme("a")).await;
    let b = get(&http, server.url("/sse"), &acme("b")).await;
    assert_eq!((a.status(), b.status()), (StatusCode::OK, StatusCode::OK));
    for key in ["tenant:acme", "app:a", "app:b"] {
        wait_in_flight(&api, key, 1 + u64::from(key == "tenant:acme")).await;
    }
    wait_in_flight(&api, "global", 2).await;
    let hits = upstream.hits();
    for app in ["a", "c"] {
        let refused = get(&http, server.url("/echo/x"), &acme(app)).await;
        assert!(refused.headers().contains_key("retry-after"));
        let (status, body) = code_of(refused).await;
        assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "app {app}: {body}");
        assert_eq!(body["code"], "too_many_requests");
        assert_eq!(body["key"], "tenant:acme", "the 429 names the refusing key");
        assert_eq!(body["status"], 429);
        assert!(body["message"].as_str().is_some());
    }
    assert_eq!(upstream.hits(), hits, "nothing was forwarded");
    // Nothing taken by the refusals: all or none.
    wait_in_flight(&api, "app:c", 0).await;
    wait_in_flight(&api, "app:a", 1).await;
    wait_in_flight(&api, "global", 2).await;
    // Another tenant's same app is admitted, under its own tenant key.
    let other = get(
        &http,
        server.url("/echo/x"),
        &[("x-tenant-id", "globex"), ("x-app-id", "a")],
    )
    .await;
    assert_eq!(other.status(), StatusCode::OK);
    drop((a, b));
    wait_in_flight(&api, "tenant:acme", 0).await;
    wait_in_flight(&api, "app:a", 0).await;
    wait_in_flight(&api, "global", 0).await;
}

async fn missing_keys_are_rejected_or_passed_and_duplicates_always_refused<M: Make>() {
    let tenant = ["tenant:{header:X-Tenant-Id}"];
    let (_redis, upstream, server) = proxied::<M>(limits(1, 0), |s| templates(s, &tenant)).await;
    let http = Client::new();
    for headers in [&[][..], &[("x-tenant-id", "")][..]] {
        let (status, body) = code_of(get(&http, server.url("/echo/x"), headers).await).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{headers:?}");
        assert_eq!(body["code"], "missing_key", "{headers:?}");
        assert!(body.get("key").is_none(), "{body}");
    }
    let twice = [("x-tenant-id", "acme"), ("X-Tenant-Id", "evil")];
    let (status, body) = code_of(get(&http, server.url("/echo/x"), &twice).await).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (StatusCode::BAD_REQUEST, Some("invalid_key"))
    );
    assert_eq!(upstream.hits(), 0, "nothing was forwarded");

    let (_redis, upstream, server) = proxied::<M>(limits(1, 0), |s| {
        templates(s, &tenant);
        s.on_missing_key = "pass".to_owned();
    })
    .await;
    let metrics = server.url("/_inflight/metrics");
    // Unkeyed requests go through without a limit, and are not in flight.
    let mut streams = Vec::new();
    for _ in 0..2 {
        let stream = get(&http, server.url("/sse"), &[]).await;
        assert_eq!(stream.status(), StatusCode::OK);
        streams.push(stream);
    }
    let empty = get(&http, server.url("/echo/x"), &[("x-tenant-id", "")]).await;
    assert_eq!(empty.status(), StatusCode::OK);
    assert_eq!(metric(&http, &metrics, "inflight_in_flight").await, 0.0);
    // Keyed requests are still limited.
    let keyed = get(&http, server.url("/sse"), &[("x-tenant-id", "acme")]).await;
    assert_eq!(keyed.status(), StatusCode::OK);
    assert_eq!(metric(&http, &metrics, "inflight_in_flight").await, 1.0);
    let full = get(&http, server.url("/echo/x"), &[("x-tenant-id", "acme")]).await;
    assert_eq!(full.status(), StatusCode::TOO_MANY_REQUESTS);
    // A duplicated header does not pass: the upstream may read either value as the tenant.
    let hits = upstream.hits();
    let (status, body) = code_of(get(&http, server.url("/echo/x"), &twice).await).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (StatusCode::BAD_REQUEST, Some("invalid_key"))
    );
    assert_eq!(upstream.hits(), hits);
    drop((streams, keyed));
}

/// `--key-header` with no `--key` is one key from that header, refused when duplicated; with `--key`, one more.
async fn the_key_header_alone_is_one_key_and_a_duplicate_is_refused<M: Make>() {
    let (_redis, upstream, server) = proxied::<M>(limits(1, 0), |s| {
        s.key_header = Some("X-App".to_owned());
    })
    .await;
    let http = Client::new();
    let stream = get(&http, server.url("/sse"), &[("x-app", "one")]).await;
    assert_eq!(stream.status(), StatusCode::OK);
    wait_in_flight(&server.url("/_inflight"), "one", 1).await;
    let (status, body) =
        code_of(get(&http, server.url("/echo/x"), &[("x-app", "one")]).await).await;
    assert_eq!(
        (status, &body["key"]),
        (StatusCode::TOO_MANY_REQUESTS, &"one".into())
    );
    let twice = [("x-app", "two"), ("x-app", "three")];
    let (status, body) = code_of(get(&http, server.url("/echo/x"), &twice).await).await;
    assert_eq!(
        (status, &body["code"]),
        (StatusCode::BAD_REQUEST, &"invalid_key".into())
    );
    let (status, body) = code_of(get(&http, server.url("/echo/x"), &[]).await).await;
    assert_eq!(
        (status, &body["code"]),
        (StatusCode::BAD_REQUEST, &"missing_key".into())
    );
    assert_eq!(upstream.hits(), 1);
    drop(stream);

    // With --key too, the header's key comes first and the templates' follow.
    let (_redis, _upstream, server) = proxied::<M>(limits(1, 0), |s| {
        s.key_header = Some("X-App".to_owned());
        templates(s, &["global"]);
    })
    .await;
    let stream = get(&http, server.url("/sse"), &[("x-app", "one")]).await;
    assert_eq!(stream.status(), StatusCode::OK);
    let (status, body) =
        code_of(get(&http, server.url("/echo/x"), &[("x-app", "two")]).await).await;
    assert_eq!(
        (status, &body["key"]),
        (StatusCode::TOO_MANY_REQUESTS, &"global".into())
    );
    let (status, body) = code_of(get(&http, server.url("/echo/x"), &[]).await).await;
    assert_eq!(
        (status, &body["code"]),
        (StatusCode::BAD_REQUEST, &"missing_key".into())
    );
    drop(stream);
}

per_store!(
    a_full_tenant_refuses_every_app_of_it_at_once,
    missing_keys_are_rejected_or_passed_and_duplicates_always_refused,
    the_key_header_alone_is_one_key_and_a_duplicate_is_refused,
);
