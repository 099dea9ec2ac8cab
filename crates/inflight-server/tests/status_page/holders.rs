//! The key view of the page in a real headless Chromium driven over the DevTools protocol
//! (common/browser.rs's `Tab`), on `inflight serve` with an admin token: a click on a busy key lists its
//! holders and waiters (a page at a time), a click on revoke takes one away; opened without the admin
//! token the page can send, the view says what it needs and shows no id.

use std::time::{Duration, Instant};

use percent_encoding::{utf8_percent_encode, NON_ALPHANUMERIC};
use reqwest::{Client, StatusCode};
use serde_json::{json, Value};

use crate::common::browser::{chromium, Tab};
use crate::common::process::{listen_of, Running};

const ADMIN: &str = "adm-s3cret";
const API: &str = "api-s3cret";
/// A key, and below labels and a flow, that are markup: shown as text.
const KEY: &str = r#"app:<b>busy</b> & "co"/1"#;
const ALICE: &str = "<img src=x onerror=alert(1)> alice";
const FLOW: &str = "<i>acme</i>";

/// `inflight serve` on the memory store, one worker, with both tokens; keys hold 2, `many:*` 200,
/// leases 10 minutes (longer than any run); and its base URL.
fn serve() -> (Running, String) {
    let args = [
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--workers",
        "1",
        "--default-limit",
        "2",
        "--limit",
        "many:*=200",
        "--lease",
        "10m",
    ];
    let tokens = [("INFLIGHT_ADMIN_TOKEN", ADMIN), ("INFLIGHT_API_TOKEN", API)];
    let (running, started) = Running::start_with_env(&args, &tokens);
    let base = format!("http://{}", listen_of(&started));
    (running, base)
}

/// The URL of `/v1/keys/{key}` then `rest`.
fn key_url(base: &str, key: &str, rest: &str) -> String {
    format!(
        "{base}/v1/keys/{}{rest}",
        utf8_percent_encode(key, NON_ALPHANUMERIC)
    )
}

/// A permit on `key` taken with `body` and the API token (waiting if the body says so): its answer.
async fn post(http: &Client, base: &str, key: &str, body: Value) -> reqwest::Response {
    http.post(key_url(base, key, "/permits"))
        .bearer_auth(API)
        .json(&body)
        .send()
        .await
        .unwrap()
}

/// A permit held on `key` with `body`: its JSON.
async fn hold(http: &Client, base: &str, key: &str, body: Value) -> Value {
    let response = post(http, base, key, body).await;
    assert_eq!(response.status(), StatusCode::CREATED);
    response.json().await.unwrap()
}

/// The first page of `key`'s holders and waiters, as the admin lists them.
async fn listing(http: &Client, base: &str, key: &str) -> Value {
    let response = http
        .get(key_url(base, key, "/permits"))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    response.json().await.unwrap()
}

/// A JavaScript string literal of `text`.
fn js(text: &str) -> String {
    serde_json::to_string(text).unwrap()
}

/// The key's button in the busy keys' table.
fn key_button(key: &str) -> String {
    format!(
        "Array.from(document.querySelectorAll('#keys tr'))\
         .filter(function (tr) {{ return tr.getAttribute('data-key') === {}; }})\
         .map(function (tr) {{ return tr.querySelector('button.keylink'); }})[0]",
        js(key)
    )
}

/// The labels of the rows of the view's table `tbody` (`holders` or `waiters`).
fn labels(tbody: &str) -> String {
    format!(
        "Array.from(document.querySelectorAll('#{tbody} tr'))\
         .map(function (tr) {{ return tr.cells[0].firstChild.textContent; }})"
    )
}

/// The cells' texts of the row of `tbody` labelled `label`, or null.
fn row_of(tbody: &str, label: &str) -> String {
    format!(
        "Array.from(document.querySelectorAll('#{tbody} tr'))\
         .filter(function (tr) {{ return tr.cells[0].firstChild.textContent === {}; }})\
         .map(function (tr) {{ return Array.from(tr.cells).map(function (td) {{ return td.textContent; }}); }})[0] || null",
        js(label)
    )
}

/// The revoke button of the row of `tbody` labelled `label`.
fn revoke_button(tbody: &str, label: &str) -> String {
    format!(
        "Array.from(document.querySelectorAll('#{tbody} tr'))\
         .filter(function (tr) {{ return tr.cells[0].firstChild.textContent === {}; }})\
         .map(function (tr) {{ return tr.querySelector('button.revoke'); }})[0]",
        js(label)
    )
}

fn sorted(value: Value) -> Vec<String> {
    let mut texts: Vec<String> = serde_json::from_value(value).unwrap();
    texts.sort();
    texts
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chromium_lists_a_keys_holders_and_waiters_and_revokes_them() {
    let Some(chromium) = chromium() else { return };
    let (_server, base) = serve();
    let http = Client::new();
    let alice = hold(&http, &base, KEY, json!({"holder": ALICE})).await;
    let bob = hold(&http, &base, KEY, json!({"holder": "bob"})).await;
    let waiting = |body: Value| {
        let (http, base) = (http.clone(), base.clone());
        tokio::spawn(async move { post(&http, &base, KEY, body).await })
    };
    let carol =
        waiting(json!({"holder": "carol", "wait_ms": 300_000, "priority": 3, "flow": FLOW}));
    let dave = waiting(json!({"holder": "dave", "wait_ms": 300_000}));
    let started = Instant::now();
    while listing(&http, &base, KEY).await["waiters"]
        .as_array()
        .unwrap()
        .len()
        < 2
    {
        assert!(started.elapsed() < Duration::from_secs(30), "never waiting");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // One holder more than a page of the listing holds.
    for n in 0..101 {
        hold(
            &http,
            &base,
            "many:k",
            json!({"holder": format!("worker {n}")}),
        )
        .await;
    }

    let mut tab = Tab::start(&chromium).await;
    tab.goto(&format!("{base}/status?token={ADMIN}")).await;
    tab.click(&key_button(KEY), "the key").await;
    tab.wait_for(
        "document.querySelectorAll('#holders tr').length === 2",
        "two holders listed",
    )
    .await;
    assert_eq!(
        tab.eval("document.getElementById('detail-key').textContent")
            .await,
        KEY
    );
    assert_eq!(
        sorted(tab.eval(&labels("holders")).await),
        [ALICE, "bob"].map(String::from)
    );
    let alice_row = tab.eval(&row_of("holders", ALICE)).await;
    let alice_id = alice["id"].as_str().unwrap();
    // Label and id; weight; held for; the lease's end; the button.
    assert_eq!(alice_row[0], format!("{ALICE}{alice_id}"), "{alice_row}");
    assert_eq!(alice_row[1], "1", "{alice_row}");
    assert!(
        alice_row[2].as_str().unwrap().ends_with(" s"),
        "{alice_row}"
    );
    assert!(
        alice_row[3].as_str().unwrap().starts_with("in "),
        "{alice_row}"
    );
    assert_eq!(alice_row[4], "revoke", "{alice_row}");
    assert_eq!(
        sorted(tab.eval(&labels("waiters")).await),
        ["carol", "dave"].map(String::from)
    );
    let carol_row = tab.eval(&row_of("waiters", "carol")).await;
    assert_eq!(carol_row[1], "3", "priority: {carol_row}");
    assert_eq!(carol_row[2], FLOW, "{carol_row}");
    assert_eq!(tab.eval(&row_of("waiters", "dave")).await[2], "(none)");
    assert_eq!(
        tab.eval("document.querySelectorAll('img, b, i').length")
            .await,
        0,
        "markup of a key, label or flow became elements"
    );

    // Revoking a waiter: its row goes, and its request is answered.
    tab.click(&revoke_button("waiters", "dave"), "dave's revoke")
        .await;
    tab.wait_for(
        &format!("({}) === null", row_of("waiters", "dave")),
        "dave gone",
    )
    .await;
    let dave = dave.await.unwrap();
    assert_eq!(dave.status(), StatusCode::CONFLICT);
    // A holder: its row goes, the server lists it no more, and its slot goes to carol.
    tab.click(&revoke_button("holders", ALICE), "alice's revoke")
        .await;
    tab.wait_for(
        &format!("({}) === null", row_of("holders", ALICE)),
        "alice gone",
    )
    .await;
    assert_eq!(sorted(tab.eval(&labels("holders")).await), ["bob"]);
    let carol = carol.await.unwrap();
    assert_eq!(carol.status(), StatusCode::CREATED);
    let listed = listing(&http, &base, KEY).await;
    let ids: Vec<&str> = listed["holders"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["id"].as_str().unwrap())
        .collect();
    assert!(!ids.contains(&alice_id), "{listed}");
    assert!(ids.contains(&bob["id"].as_str().unwrap()), "{listed}");
    assert_eq!(listed["waiters"], json!([]), "{listed}");

    // A page at a time: 100 holders, then "more" lists the last.
    tab.click(&key_button("many:k"), "many:k").await;
    tab.wait_for(
        "document.querySelectorAll('#holders tr').length === 100 \
         && !document.getElementById('more').hidden",
        "a first page of 100 holders",
    )
    .await;
    tab.click("document.getElementById('more')", "more").await;
    tab.wait_for(
        "document.querySelectorAll('#holders tr').length === 101 \
         && document.getElementById('more').hidden",
        "all 101 holders",
    )
    .await;
    let many = sorted(tab.eval(&labels("holders")).await);
    let mut expected: Vec<String> = (0..101).map(|n| format!("worker {n}")).collect();
    expected.sort();
    assert_eq!(many, expected);
    tab.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chromium_without_the_admin_token_shows_a_note_and_no_id() {
    let Some(chromium) = chromium() else { return };
    let (_server, base) = serve();
    let http = Client::new();
    let alice = hold(&http, &base, KEY, json!({"holder": "alice"})).await;
    let alice_id = alice["id"].as_str().unwrap();
    // With an admin token set, the API token opens neither the page nor the listing.
    let page = http
        .get(format!("{base}/status?token={API}"))
        .send()
        .await
        .unwrap();
    assert_eq!(page.status(), StatusCode::UNAUTHORIZED);
    let listed = http
        .get(key_url(&base, KEY, "/permits"))
        .bearer_auth(API)
        .send()
        .await
        .unwrap();
    assert_eq!(listed.status(), StatusCode::UNAUTHORIZED);

    // The page opened with the admin token in a header (as a proxy in front might add it to the page's
    // routes), which its script cannot send on.
    let mut tab = Tab::start(&chromium).await;
    tab.authorize("*/status*", &format!("Bearer {ADMIN}")).await;
    tab.goto(&format!("{base}/status")).await;
    tab.click(&key_button(KEY), "the key").await;
    tab.wait_for(
        "document.getElementById('detail-note').textContent.indexOf('needs the admin token') >= 0",
        "the note",
    )
    .await;
    assert_eq!(
        tab.eval("document.getElementById('detail-lists').hidden")
            .await,
        true
    );
    assert_eq!(
        tab.eval("document.querySelectorAll('#holders tr, #waiters tr').length")
            .await,
        0
    );
    let html = tab.eval("document.documentElement.outerHTML").await;
    let html = html.as_str().unwrap();
    assert!(!html.contains(alice_id), "an id is shown: {html}");
    assert!(!html.contains("alice"), "a holder is shown: {html}");
    tab.close().await;
}
