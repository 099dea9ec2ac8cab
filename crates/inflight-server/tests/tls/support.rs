//! What the TLS tests share: certificates in files, a server with TLS in-process, TLS clients.
#![allow(unreachable_pub)]

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use inflight::MemoryStore;
use inflight_server::config::TlsSettings;
use inflight_server::server::{self, Bounds, Tls, Workers};
use inflight_server::{ProxySettings, Settings};
use rustls::pki_types::{CertificateDer, ServerName};
use serde_json::Value;
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;
use tokio::sync::oneshot;
use tokio_rustls::client::TlsStream;

pub const KEY: &str = "x-inflight-key";

/// The longest any wait here takes.
pub const WAIT: Duration = Duration::from_secs(5);

/// A self-signed certificate for `localhost` and its key, as PEM, and the certificate's DER.
pub fn self_signed() -> (String, String, CertificateDer<'static>) {
    let certified = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
    let der = certified.cert.der().clone();
    (
        certified.cert.pem(),
        certified.key_pair.serialize_pem(),
        der,
    )
}

/// A certificate and its key written to files in a temporary directory.
pub struct Files {
    pub dir: tempfile::TempDir,
    /// The certificate's DER, which clients trust and compare.
    pub der: CertificateDer<'static>,
}

impl Files {
    pub fn new() -> Self {
        let files = Self {
            dir: tempfile::tempdir().unwrap(),
            der: CertificateDer::from(Vec::new()),
        };
        files.renewed()
    }

    /// The files with a new certificate and key in them.
    pub fn renewed(mut self) -> Self {
        let (cert, key, der) = self_signed();
        std::fs::write(self.cert(), cert).unwrap();
        std::fs::write(self.key(), key).unwrap();
        self.der = der;
        self
    }

    pub fn cert(&self) -> PathBuf {
        self.dir.path().join("cert.pem")
    }

    pub fn key(&self) -> PathBuf {
        self.dir.path().join("key.pem")
    }

    pub fn settings(&self) -> TlsSettings {
        TlsSettings {
            tls_cert: Some(self.cert()),
            tls_key: Some(self.key()),
        }
    }
}

/// A server in-process with TLS on its served port.
pub struct Server {
    pub addr: SocketAddr,
    pub tls: Tls,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl Server {
    /// `serve` with `settings` (TLS included), or the proxy that `proxy` describes.
    pub async fn start(settings: &Settings, proxy: Option<&ProxySettings>) -> Self {
        let settings = proxy.map_or(settings, |proxy| &proxy.serve);
        let upstream = proxy.map(|proxy| inflight_server::upstream(proxy).unwrap());
        let tls = Tls::load(&settings.tls).unwrap().expect("TLS settings");
        let listeners = server::bind("127.0.0.1:0".parse().unwrap(), settings.workers()).unwrap();
        let addr = listeners[0].local_addr().unwrap();
        let store = inflight::AnyStore::from(MemoryStore::new());
        let app = {
            let settings = settings.clone();
            let shared = inflight_server::Shared::new(&settings).unwrap();
            move || Ok(inflight_server::app(&settings, &shared, store.clone())?)
        };
        let bounds = Bounds {
            tls: Some(tls.clone()),
            ..settings.into()
        };
        let workers = Workers::start(listeners, app, upstream, bounds, None)
            .await
            .expect("the workers start");
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(workers.run(async {
            let _ = stopped.await;
        }));
        Self {
            addr,
            tls,
            stop: Some(stop),
            task,
        }
    }

    pub async fn shutdown(mut self) {
        let _ = self.stop.take().map(|stop| stop.send(()));
        tokio::time::timeout(WAIT, &mut self.task)
            .await
            .expect("the server stops")
            .unwrap()
            .unwrap();
    }
}

/// A client trusting only `root`, offering `alpn`.
pub fn client(root: &CertificateDer<'static>, alpn: &[&[u8]]) -> tokio_rustls::TlsConnector {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(root.clone()).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    tokio_rustls::TlsConnector::from(Arc::new(config))
}

/// A TLS connection to `addr` as `localhost`, trusting only `root`.
pub async fn connect(
    addr: SocketAddr,
    root: &CertificateDer<'static>,
    alpn: &[&[u8]],
) -> TlsStream<TcpStream> {
    let tcp = TcpStream::connect(addr).await.unwrap();
    let name = ServerName::try_from("localhost").unwrap();
    tokio::time::timeout(WAIT, client(root, alpn).connect(name, tcp))
        .await
        .expect("the handshake ends in time")
        .expect("the handshake succeeds")
}

/// The certificate the server presented on `tls`.
pub fn peer_cert(tls: &TlsStream<TcpStream>) -> CertificateDer<'static> {
    tls.get_ref().1.peer_certificates().unwrap()[0].clone()
}

pub fn alpn(tls: &TlsStream<TcpStream>) -> Option<Vec<u8>> {
    tls.get_ref().1.alpn_protocol().map(<[u8]>::to_vec)
}

pub type Sender = hyper::client::conn::http2::SendRequest<Empty<Bytes>>;

pub fn get(path: &str, key: &str) -> http::Request<Empty<Bytes>> {
    http::Request::get(format!("https://localhost{path}"))
        .header(KEY, key)
        .body(Empty::new())
        .unwrap()
}

/// `GET path` on an HTTP/2 connection: its status and whole body.
pub async fn h2_get(sender: &mut Sender, path: &str) -> (http::StatusCode, Bytes) {
    let response = sender.send_request(get(path, "none")).await.unwrap();
    let status = response.status();
    (
        status,
        response.into_body().collect().await.unwrap().to_bytes(),
    )
}

/// The key's in_flight, asked on the API under /_inflight over `sender`.
pub async fn in_flight(sender: &mut Sender, key: &str) -> Value {
    let (status, body) = h2_get(sender, &format!("/_inflight/v1/keys/{key}")).await;
    assert_eq!(status, http::StatusCode::OK);
    serde_json::from_slice::<Value>(&body).unwrap()["in_flight"].clone()
}

/// Polls the key's in_flight until it is `want`; panics after `WAIT`.
pub async fn wait_in_flight(sender: &mut Sender, key: &str, want: u64) {
    let started = Instant::now();
    loop {
        let now = in_flight(sender, key).await;
        if now == want {
            return;
        }
        assert!(started.elapsed() < WAIT, "in_flight of {key} stayed {now}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// One answer read from `tls` to the close of the connection (a bounded wait).
pub async fn read_to_close(tls: &mut TlsStream<TcpStream>) -> String {
    let mut bytes = Vec::new();
    let mut chunk = [0u8; 4096];
    let read = async {
        loop {
            match tls.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => bytes.extend_from_slice(&chunk[..n]),
            }
        }
    };
    tokio::time::timeout(WAIT, read)
        .await
        .expect("closed in time");
    String::from_utf8_lossy(&bytes).into_owned()
}

/// `GET /healthz` on an HTTP/1.1 connection over TLS.
pub async fn healthz(sender: &mut hyper::client::conn::http1::SendRequest<Empty<Bytes>>) {
    let request = http::Request::get("/healthz")
        .header("host", "localhost")
        .body(Empty::new())
        .unwrap();
    sender.ready().await.unwrap();
    let response = sender.send_request(request).await.unwrap();
    assert_eq!(response.status(), http::StatusCode::OK);
    response.into_body().collect().await.unwrap();
}
