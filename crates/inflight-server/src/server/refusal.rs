//! hyper's own refusals, in JSON. hyper answers an HTTP/1 request it cannot read (a malformed request
//! line or header, bad framing, a URI over 65,534 bytes, headers over its buffer or more than 100) by
//! itself, with a status and an empty body, and closes the connection; it offers no hook to answer
//! otherwise. The connection's writer ([`super::guarded`]) sees that answer go out between exchanges and
//! sends this one in its place: the same status, `{"code","message","status"}`, and `Connection: close`.

use http::StatusCode;

/// Our answer in place of `head`, the automatic answer hyper wrote (`HTTP/1.1 431 ...\r\n...\r\n\r\n`);
/// `None` when `head` is not one.
pub(super) fn answer(head: &[u8]) -> Option<Vec<u8>> {
    let head = std::str::from_utf8(head).ok()?;
    let head = head.strip_suffix("\r\n\r\n")?;
    let (status_line, headers) = head.split_once("\r\n").unwrap_or((head, ""));
    // hyper answers in the version of the connection's last request: 1.0 after a kept-alive HTTP/1.0 one.
    let (version, status) = status_line.split_once(' ')?;
    if version != "HTTP/1.1" && version != "HTTP/1.0" {
        return None;
    }
    let code = status.get(..3)?;
    let status = StatusCode::from_bytes(code.as_bytes()).ok()?;
    if !status.is_client_error() {
        return None;
    }
    let (code, message) = describe(status);
    let body = serde_json::json!({ "code": code, "message": message, "status": status.as_u16() })
        .to_string();
    let mut answer = format!(
        "{version} {} {}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n",
        status.as_u16(),
        status.canonical_reason().unwrap_or("Bad Request"),
        body.len()
    );
    // hyper's own headers, but for the framing ones, which are ours now.
    for line in headers.split("\r\n").filter(|line| !line.is_empty()) {
        let name = line.split(':').next().unwrap_or_default();
        if !name.eq_ignore_ascii_case("content-length") && !name.eq_ignore_ascii_case("connection")
        {
            answer.push_str(line);
            answer.push_str("\r\n");
        }
    }
    answer.push_str("\r\n");
    answer.push_str(&body);
    Some(answer.into_bytes())
}

/// The stable code and the message of a refusal.
fn describe(status: StatusCode) -> (&'static str, &'static str) {
    match status {
        StatusCode::URI_TOO_LONG => (
            "uri_too_long",
            "The request's URI is too long (at most 65,534 bytes).",
        ),
        StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE => (
            "headers_too_large",
            "The request's headers are too large (at most 100 headers, about 400 KB in all).",
        ),
        _ => (
            "bad_request",
            "The request is not valid HTTP/1.1: its request line, a header or its framing \
             (Content-Length, Transfer-Encoding) is malformed.",
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::answer;

    fn text(bytes: Vec<u8>) -> String {
        String::from_utf8(bytes).unwrap()
    }

    #[test]
    fn hypers_refusals_become_json_with_a_stable_code() {
        for (status, code) in [
            ("400 Bad Request", "bad_request"),
            ("414 URI Too Long", "uri_too_long"),
            ("431 Request Header Fields Too Large", "headers_too_large"),
        ] {
            let head = format!(
                "HTTP/1.1 {status}\r\ncontent-length: 0\r\ndate: Mon, 01 Jan 2024 00:00:00 GMT\r\n\r\n"
            );
            let answer = text(answer(head.as_bytes()).expect("a refusal"));
            let (head, body) = answer.split_once("\r\n\r\n").unwrap();
            assert!(
                head.starts_with(&format!("HTTP/1.1 {status}\r\n")),
                "{head}"
            );
            assert!(
                head.contains("\r\ndate: Mon, 01 Jan 2024"),
                "hyper's date kept: {head}"
            );
            assert!(head.contains("\r\nconnection: close"), "{head}");
            assert!(!head.contains("content-length: 0"), "{head}");
            assert!(
                head.contains(&format!("content-length: {}", body.len())),
                "{head}"
            );
            let json: serde_json::Value = serde_json::from_str(body).unwrap();
            assert_eq!(json["code"], code);
            assert_eq!(json["status"], status[..3].parse::<u16>().unwrap());
            assert!(json["message"].as_str().is_some_and(|m| !m.is_empty()));
        }
    }

    #[test]
    fn a_refusal_after_a_kept_alive_http_1_0_request_keeps_its_version() {
        let head = b"HTTP/1.0 400 Bad Request\r\ncontent-length: 0\r\n\r\n";
        let answer = text(answer(head).expect("a refusal"));
        assert!(
            answer.starts_with("HTTP/1.0 400 Bad Request\r\n"),
            "{answer}"
        );
        let body = answer.split_once("\r\n\r\n").unwrap().1;
        let json: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(json["code"], "bad_request");
    }

    #[test]
    fn anything_else_is_left_as_it_is() {
        for head in [
            &b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n"[..],
            b"HTTP/1.1 500 Internal Server Error\r\n\r\n",
            b"HTTP/1.1 404 Not Found\r\ncontent-length: 0",
            b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-length: 0\r\n",
            b"HTTP/1.1 4",
            b"HTTP/1.1 abc\r\n\r\n",
            b"HTTP/2.0 400 Bad Request\r\n\r\n",
            b"\xff\xfe",
        ] {
            assert!(
                answer(head).is_none(),
                "{:?}",
                String::from_utf8_lossy(head)
            );
        }
    }
}
