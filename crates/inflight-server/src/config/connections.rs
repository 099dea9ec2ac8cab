//! The bounds of a server's connections, `serve`'s and `proxy`'s alike: how long a client may take at
//! each step, how many connections a process holds open, and HTTP/2's stream and window limits.

use std::time::Duration;

use clap::Args;
use serde::{Deserialize, Serialize};

use super::{invalid, text, ConfigError, MAX_LEASE};

/// The largest HTTP/2 flow-control window (RFC 9113 6.9.1).
const MAX_WINDOW: u32 = (1 << 31) - 1;

/// How long clients may take, and how many connections they may hold.
#[derive(Clone, Debug, Args, Serialize, Deserialize)]
#[command(next_help_heading = "Connections")]
pub struct Connections {
    /// How long a client may take to send a request's headers, from its first byte (or from the
    /// connection's opening), before its connection is closed.
    #[arg(long, env = "INFLIGHT_HEADER_TIMEOUT", value_name = "DURATION")]
    #[arg(default_value = "10s", value_parser = text::parse)]
    #[serde(with = "text")]
    pub header_timeout: Duration,
    /// How long a kept-alive connection may wait for its next request (HTTP/2: with no stream open)
    /// before it is closed.
    #[arg(long, env = "INFLIGHT_IDLE_TIMEOUT", value_name = "DURATION")]
    #[arg(default_value = "60s", value_parser = text::parse)]
    #[serde(with = "text")]
    pub idle_timeout: Duration,
    /// How long the server may wait for a request's body in all (the clock stops while the reader is
    /// busy elsewhere, e.g. held back by an upstream); past it the request is answered 408
    /// body_timeout and its connection closed.
    #[arg(long, env = "INFLIGHT_BODY_TIMEOUT", value_name = "DURATION")]
    #[arg(default_value = "30s", value_parser = text::parse)]
    #[serde(with = "text")]
    pub body_timeout: Duration,
    /// The slowest a request's body may arrive, in bytes a second, after its first 5 s of waiting
    /// (a slower one is answered 408 body_timeout); 0: no minimum.
    #[arg(long, env = "INFLIGHT_BODY_MIN_RATE", value_name = "BYTES")]
    #[arg(default_value_t = 1024)]
    pub body_min_rate: u64,
    /// How long a write of an answer may wait for the client to make room (it reads nothing of it)
    /// before the connection is closed; a proxied answer's permit is then released.
    #[arg(long, env = "INFLIGHT_SEND_TIMEOUT", value_name = "DURATION")]
    #[arg(default_value = "30s", value_parser = text::parse)]
    #[serde(with = "text")]
    pub send_timeout: Duration,
    /// How long one `/status/events` stream lasts before the server ends it (the page reconnects at
    /// once): a watcher that reads nothing holds one of the 32 places that long at most.
    #[arg(long, env = "INFLIGHT_STATUS_STREAM_LIFETIME", value_name = "DURATION")]
    #[arg(default_value = "60s", value_parser = text::parse)]
    #[serde(with = "text")]
    pub status_stream_lifetime: Duration,
    /// Open connections per process on the served port (all workers together); at the cap the server
    /// stops accepting and new connections wait in the listen queue. Lowered at start to what the
    /// file-descriptor limit leaves room for.
    #[arg(long, env = "INFLIGHT_MAX_CONNECTIONS", value_name = "N")]
    #[arg(default_value_t = 10_000)]
    pub max_connections: usize,
    /// HTTP/2: streams (requests) one connection may have open at once.
    #[arg(long, env = "INFLIGHT_HTTP2_MAX_CONCURRENT_STREAMS", value_name = "N")]
    #[arg(default_value_t = 128)]
    pub http2_max_concurrent_streams: u32,
    /// HTTP/2: bytes of a request body a client may send ahead on one stream (its flow-control window).
    #[arg(long, env = "INFLIGHT_HTTP2_STREAM_WINDOW", value_name = "BYTES")]
    #[arg(default_value_t = 256 * 1024)]
    pub http2_stream_window: u32,
    /// HTTP/2: bytes of request bodies a client may send ahead on one connection, all streams together.
    #[arg(long, env = "INFLIGHT_HTTP2_CONNECTION_WINDOW", value_name = "BYTES")]
    #[arg(default_value_t = 1024 * 1024)]
    pub http2_connection_window: u32,
    /// HTTP/2: the largest header list a request may have (decoded); larger is refused (431).
    #[arg(
        long,
        env = "INFLIGHT_HTTP2_MAX_HEADER_LIST_SIZE",
        value_name = "BYTES"
    )]
    #[arg(default_value_t = 16 * 1024)]
    pub http2_max_header_list_size: u32,
    /// HTTP/2: how often the server pings a connection's client, which is closed when no answer comes
    /// within 20 s; 0s: never.
    #[arg(
        long,
        env = "INFLIGHT_HTTP2_KEEP_ALIVE_INTERVAL",
        value_name = "DURATION"
    )]
    #[arg(default_value = "30s", value_parser = text::parse)]
    #[serde(with = "text")]
    pub http2_keep_alive_interval: Duration,
}

impl Connections {
    /// Checks each value against its range, naming the setting of a bad one.
    pub fn check(&self) -> Result<(), ConfigError> {
        for (setting, value) in [
            ("header_timeout", self.header_timeout),
            ("idle_timeout", self.idle_timeout),
            ("body_timeout", self.body_timeout),
            ("send_timeout", self.send_timeout),
            ("status_stream_lifetime", self.status_stream_lifetime),
        ] {
            if value < Duration::from_millis(10) || value > MAX_LEASE {
                return Err(invalid(setting, "must be between 10ms and 24h"));
            }
        }
        let interval = self.http2_keep_alive_interval;
        if !interval.is_zero() && (interval < Duration::from_secs(1) || interval > MAX_LEASE) {
            let reason = "must be 0s (no pings) or between 1s and 24h";
            return Err(invalid("http2_keep_alive_interval", reason));
        }
        let ranges: [(&str, u64, u64, u64); 6] = [
            ("body_min_rate", self.body_min_rate, 0, 1 << 30),
            ("max_connections", self.max_connections as u64, 1, 1_000_000),
            (
                "http2_max_concurrent_streams",
                self.http2_max_concurrent_streams.into(),
                1,
                10_000,
            ),
            (
                "http2_stream_window",
                self.http2_stream_window.into(),
                1024,
                MAX_WINDOW.into(),
            ),
            (
                "http2_connection_window",
                self.http2_connection_window.into(),
                65_535,
                MAX_WINDOW.into(),
            ),
            (
                "http2_max_header_list_size",
                self.http2_max_header_list_size.into(),
                1024,
                16 << 20,
            ),
        ];
        for (setting, value, low, high) in ranges {
            if !(low..=high).contains(&value) {
                return Err(invalid(
                    setting,
                    format!("must be between {low} and {high}"),
                ));
            }
        }
        Ok(())
    }
}
