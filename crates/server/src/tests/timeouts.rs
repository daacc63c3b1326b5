//! Clients that connect and never finish a request: their connections close
//! on a deadline, and other clients are served meanwhile.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::*;

/// Reads until the server closes the connection (or 5 s pass).
async fn read_to_close(conn: &mut TcpStream) -> String {
    let mut got = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), conn.read_to_end(&mut got)).await;
    assert!(read.is_ok(), "the server kept a stalled connection open");
    String::from_utf8_lossy(&got).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_request_heads_are_closed_on_a_deadline() {
    let (_fake, app) = app();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let stop = async move {
        let _ = stop_rx.await;
    };
    let server = tokio::spawn(crate::listen::serve_until(listener, app, stop, Duration::from_millis(300)));

    let mut silent = TcpStream::connect(addr).await.unwrap();
    let mut half = TcpStream::connect(addr).await.unwrap();
    half.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\n").await.unwrap();
    // Meanwhile a whole request is answered.
    let mut whole = TcpStream::connect(addr).await.unwrap();
    whole.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").await.unwrap();
    assert!(read_to_close(&mut whole).await.starts_with("HTTP/1.1 200"));
    read_to_close(&mut silent).await;
    read_to_close(&mut half).await;

    stop_tx.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(5), server).await.unwrap().unwrap();
    assert!(TcpStream::connect(addr).await.is_err());
}

#[tokio::test(start_paused = true)]
async fn a_body_that_never_arrives_is_a_408() {
    let (_fake, app) = app();
    // One chunk of the declared body, then nothing, for ever.
    let chunks = stream::iter([Ok::<_, std::io::Error>(Bytes::from_static(b"{\"prompt\": "))]).chain(stream::pending());
    let req = HttpRequest::builder()
        .method(Method::POST)
        .uri("/v1/completions")
        .header("content-type", "application/json")
        .body(Body::from_stream(chunks))
        .unwrap();
    let resp = app.oneshot(req).await.unwrap();
    assert_eq!(resp.status(), StatusCode::REQUEST_TIMEOUT);
    let body: Value = serde_json::from_slice(&to_bytes(resp.into_body(), 1 << 16).await.unwrap()).unwrap();
    assert!(body["error"]["message"].as_str().unwrap().contains("did not arrive"), "{body}");
}
