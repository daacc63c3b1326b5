//! Graceful shutdown over a real socket: in-flight streams end, the server returns.

use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_ends_streams_and_returns() {
    let fake = Fake::new();
    fake.hang.store(true, Ordering::SeqCst);
    let state = AppState::new(Served::Generator(fake.clone()), MODEL.into(), None, Some(template()));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(crate::serve_on(listener, state, async move {
        let _ = stop_rx.await;
    }));

    let body = r#"{"messages":[{"role":"user","content":"hello"}],"stream":true}"#;
    let mut conn = TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    conn.write_all(head.as_bytes()).await.unwrap();
    conn.write_all(body.as_bytes()).await.unwrap();
    let mut buf = vec![0u8; 4096];
    let n = conn.read(&mut buf).await.unwrap();
    assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"));

    stop_tx.send(()).unwrap();
    let mut rest = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), conn.read_to_end(&mut rest)).await.unwrap().unwrap();
    let text = String::from_utf8_lossy(&rest);
    assert!(text.contains("shutting down") && text.contains("data: [DONE]"), "{text}");
    tokio::time::timeout(Duration::from_secs(5), server).await.unwrap().unwrap().unwrap();
    assert_eq!(fake.live.load(Ordering::SeqCst), 0);
    assert!(TcpStream::connect(addr).await.is_err());
}
