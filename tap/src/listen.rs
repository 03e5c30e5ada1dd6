//! A store that says what it took: PostgreSQL `LISTEN` on the channel a trigger notifies
//! each inserted row on (`notify=CHANNEL` in a `postgres://` address).
//!
//! PostgreSQL hands a notification to listeners only after the transaction that sent it
//! committed, and a committed row is visible to every query that starts after that; so a
//! notification's arrival proves the row queryable by then, like a poll's response, at the
//! cost of the trigger (per row, in the writer's transaction) and one idle connection.
//! The payload is the key and the row's time as Unix microseconds, separated by a space
//! (`docs/dataset.md`, "Polled hops", gives the trigger). Polls go on beside the listener
//! (they find what a lost connection missed); whichever sees a key first reports it.
//!
//! The listener runs on a thread of its own with its own connection
//! (`application_name = 'hoptrace-listen'`). A connection that fails or is lost is opened
//! again with backoff (100 ms doubling to 2 s), each failure counted and the first of each
//! kind logged; a notification that does not parse is counted and skipped.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::mpsc::Sender;
use std::time::Duration;

use hoptrace_probe::clock::realtime_ns;
use tokio_postgres::{AsyncMessage, NoTls};

use crate::pollers::{Answer, NOTIFIER};
use crate::store::{Batch, Row};

/// What the listener did so far.
#[derive(Debug, Default)]
pub(crate) struct ListenCounts {
    /// Notifications received on the channel.
    pub(crate) notifications: AtomicU64,
    /// Notifications whose payload was not `KEY TIME_US`.
    pub(crate) bad: AtomicU64,
    /// Connections that failed to open or were lost.
    pub(crate) errors: AtomicU64,
}

/// Parses a payload `KEY TIME_US` into the key and the row time, ns.
pub(crate) fn parse_payload(payload: &str) -> Option<(&str, i64)> {
    let (key, us) = payload.trim().rsplit_once(' ')?;
    let us: i64 = us.parse().ok()?;
    let key = key.trim();
    (!key.is_empty()).then(|| (key, us.saturating_mul(1000)))
}

/// Starts listening on `channel` over a connection made with `config`; each notification
/// goes to `out` as an [`Answer`] of one row, stamped on arrival. Ends when `stop` is set
/// or `out` is gone.
pub(crate) fn start(
    config: tokio_postgres::Config,
    channel: String,
    out: Sender<Answer>,
    stop: Arc<AtomicBool>,
    counts: Arc<ListenCounts>,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new()
        .name("store-listener".into())
        .spawn(move || {
            let rt = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    tracing::error!("the store's notifications cannot be listened to: {e} (polling only)");
                    return;
                }
            };
            let mut pause = Duration::from_millis(100);
            let mut last_error = String::new();
            while !stop.load(Relaxed) {
                let r = rt.block_on(listen_once(&config, &channel, &out, &stop, &counts));
                match r {
                    Ok(()) => return,
                    Err(e) => {
                        counts.errors.fetch_add(1, Relaxed);
                        if e != last_error {
                            tracing::warn!(
                                "listening on channel {channel:?}: {e} (connecting again with backoff; polls go on finding rows; failures are counted)"
                            );
                            last_error = e;
                        }
                    }
                }
                let until = std::time::Instant::now() + pause;
                while !stop.load(Relaxed) && std::time::Instant::now() < until {
                    std::thread::sleep(Duration::from_millis(20));
                }
                pause = (pause * 2).min(Duration::from_secs(2));
            }
        })
}

/// One connection's life: `Ok` when told to stop (or nobody takes answers any more),
/// `Err` with why when the connection could not be opened or was lost.
async fn listen_once(
    config: &tokio_postgres::Config,
    channel: &str,
    out: &Sender<Answer>,
    stop: &AtomicBool,
    counts: &Arc<ListenCounts>,
) -> Result<(), String> {
    let limit = config
        .get_connect_timeout()
        .copied()
        .unwrap_or(Duration::from_secs(5));
    let (client, mut connection) = tokio::time::timeout(limit, config.connect(NoTls))
        .await
        .map_err(|_| format!("no connection within {limit:?}"))?
        .map_err(|e| e.to_string())?;
    let gone = Arc::new(AtomicBool::new(false));
    let driver = {
        let (out, counts, gone) = (out.clone(), Arc::clone(counts), Arc::clone(&gone));
        tokio::spawn(async move {
            let mut bad_logged = false;
            let why = loop {
                match std::future::poll_fn(|cx| connection.poll_message(cx)).await {
                    None => break "the connection was closed".to_owned(),
                    Some(Err(e)) => break e.to_string(),
                    Some(Ok(AsyncMessage::Notification(n))) => {
                        let arrival = realtime_ns();
                        counts.notifications.fetch_add(1, Relaxed);
                        let Some((key, time_ns)) = parse_payload(n.payload()) else {
                            counts.bad.fetch_add(1, Relaxed);
                            if !bad_logged {
                                bad_logged = true;
                                tracing::warn!(
                                    "a notification's payload {:?} is not `KEY TIME_US` (the key and the row's time as Unix microseconds; further ones are counted)",
                                    crate::store::clip(n.payload(), 80)
                                );
                            }
                            continue;
                        };
                        if out.send(notified(key, time_ns, arrival)).is_err() {
                            break String::new();
                        }
                    }
                    Some(Ok(_)) => {}
                }
            };
            gone.store(true, Relaxed);
            why
        })
    };
    let listen = format!("LISTEN {}", crate::store::postgres::quote_ident(channel));
    match tokio::time::timeout(limit, client.batch_execute(&listen)).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => {
            driver.abort();
            return Err(format!("{listen}: {e}"));
        }
        Err(_) => {
            driver.abort();
            return Err(format!("{listen}: no answer within {limit:?}"));
        }
    }
    let errors = counts.errors.load(Relaxed);
    if errors > 0 {
        tracing::info!(
            "listening on channel {channel:?} again, after {errors} failed or lost connections"
        );
    }
    while !stop.load(Relaxed) && !gone.load(Relaxed) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    if stop.load(Relaxed) {
        driver.abort();
        return Ok(());
    }
    let why = driver.await.unwrap_or_default();
    drop(client);
    if why.is_empty() {
        Ok(())
    } else {
        Err(format!("lost: {why}"))
    }
}

/// A notification as an answer of one row, with no poll behind it.
fn notified(key: &str, time_ns: i64, arrival_ns: i64) -> Answer {
    Answer {
        poller: NOTIFIER,
        send_ns: arrival_ns,
        resp_ns: arrival_ns,
        since_ns: None,
        regular_since_ns: None,
        catch_up: false,
        newest_ns: None,
        result: Ok(Batch {
            rows: vec![Row {
                key: key.to_owned(),
                time_ns,
                series: None,
            }],
            ..Batch::default()
        }),
        own_duration: None,
        epoch: 0,
        resolved: None,
        reconnections: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::parse_payload;

    #[test]
    fn payloads() {
        assert_eq!(
            parse_payload("ht1.abc 1796000000123456"),
            Some(("ht1.abc", 1_796_000_000_123_456_000))
        );
        assert_eq!(parse_payload("ht1.abc"), None);
        assert_eq!(parse_payload("ht1.abc 12.5"), None);
        assert_eq!(parse_payload(" 123"), None);
    }
}
