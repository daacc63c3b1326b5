//! The accept loop. axum's own `serve` gives hyper no timer, so a client that
//! connects and sends half a request head, or nothing, holds its connection
//! (and a file descriptor) for ever; enough of them lock every other client
//! out. Here each connection reads its request heads under a deadline, and
//! on shutdown every connection finishes its response and closes.

use std::future::Future;
use std::pin::pin;
use std::time::Duration;

use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;

/// How long a connection may take to send a request's head, counted from when
/// the server starts waiting for it (so an idle keep-alive connection closes
/// after this long too).
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(30);

/// Serves `app` on `listener` until `stop` resolves, reading request heads
/// under `header_timeout`; then stops accepting and waits until every open
/// connection has finished its response and closed.
pub async fn serve_until(listener: TcpListener, app: Router, stop: impl Future<Output = ()>, header_timeout: Duration) {
    let graceful = GracefulShutdown::new();
    let mut stop = pin!(stop);
    loop {
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                // Out of file descriptors, or a connection reset before it was
                // accepted: wait a moment rather than spin.
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = &mut stop => break,
        };
        let _ = stream.set_nodelay(true);
        let conn = http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(header_timeout)
            .serve_connection(TokioIo::new(stream), TowerToHyperService::new(app.clone()));
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            // A client that goes away or times out is no error of the server's.
            let _ = conn.await;
        });
    }
    drop(listener);
    graceful.shutdown().await;
}
