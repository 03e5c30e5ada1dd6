//! The tap's pollers: one or more connections to the store, each on a thread of its own,
//! each sending a poll when the tap hands it one. The tap hands out polls no closer than
//! its interval and only to a poller that is free (closed loop: a poller never asks a
//! slow store again before it answered). With one poller, polls leave at most every
//! query time apart; with `N` and a store that answers within `N` intervals, they leave
//! one interval apart even when a query takes longer than that, so the bound on each row
//! is about one interval plus one query time. Each poll costs the store the same.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering::Relaxed};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::time::Duration;

use hoptrace_probe::clock::realtime_ns;

use crate::store::{Batch, Store, StoreError};

/// A poll to send (or, with `resolve`, a resolution of the run's series).
#[derive(Debug, Clone)]
pub(crate) struct Ticket {
    /// The newest row time seen so far (the store derives the poll's lower bound from it).
    pub(crate) newest_ns: Option<i64>,
    /// How much further back than the store's overlap this poll looks, ns: rows have been
    /// seen arriving that late.
    pub(crate) widen_ns: i64,
    /// A catch-up poll: it looks this much further back again, ns (0: a regular poll).
    pub(crate) catch_up_ns: i64,
    /// The resolved series to poll, and their epoch (`None`: the store resolves none).
    pub(crate) series: Option<(u32, Arc<[String]>)>,
    /// Not a poll: ask the store which series its `series=` selects now.
    pub(crate) resolve: bool,
}

/// A poll's outcome.
#[derive(Debug)]
pub(crate) struct Answer {
    /// Which poller sent it.
    pub(crate) poller: usize,
    /// When it was sent and when its answer arrived, `CLOCK_REALTIME` ns.
    pub(crate) send_ns: i64,
    pub(crate) resp_ns: i64,
    /// The lower bound of the row times it asked for (`None`: every row).
    pub(crate) since_ns: Option<i64>,
    /// The lower bound a regular poll sent at the same instant asks for: the same as
    /// `since_ns` unless this is a catch-up poll, whose rows before it no regular poll
    /// would have found.
    pub(crate) regular_since_ns: Option<i64>,
    /// Whether it was a catch-up poll.
    pub(crate) catch_up: bool,
    /// The newest row time seen when it was sent (its ticket's).
    pub(crate) newest_ns: Option<i64>,
    /// What it returned.
    pub(crate) result: Result<Batch, StoreError>,
    /// The store's own duration of the query, where the tap samples one after a poll.
    pub(crate) own_duration: Option<Result<Option<u64>, StoreError>>,
    /// The epoch of the series it asked for (0 without resolved series).
    pub(crate) epoch: u32,
    /// For a resolution ticket (no poll then): the series the store selects now.
    pub(crate) resolved: Option<Result<Option<Vec<String>>, StoreError>>,
    /// Its connection's reconnections so far ([`Store::reconnections`]).
    pub(crate) reconnections: u64,
}

/// The `poller` of an answer that no poll brought: a store's notification
/// (`crate::listen`).
pub(crate) const NOTIFIER: usize = usize::MAX;

/// The pollers and which of them are free.
pub(crate) struct Pollers {
    tickets: Vec<Sender<Ticket>>,
    answers: Receiver<Answer>,
    /// Where answers go, for a listener's ([`NOTIFIER`]).
    answer_tx: Sender<Answer>,
    free: Vec<usize>,
    /// Per poller, the lower bound of the row times its poll in flight asks for:
    /// `i64::MIN` from when the tap hands it a ticket until the poller has computed it
    /// (and for a poll of every row).
    since: Vec<Arc<AtomicI64>>,
}

impl Pollers {
    /// A poller per store connection in `stores`, each on a thread of its own.
    ///
    /// # Errors
    /// A thread cannot be started.
    pub(crate) fn start(stores: Vec<Box<dyn Store>>) -> std::io::Result<Self> {
        let (answer_tx, answers) = mpsc::channel();
        let mut tickets = Vec::with_capacity(stores.len());
        let mut since = Vec::with_capacity(stores.len());
        for (i, mut store) in stores.into_iter().enumerate() {
            let (tx, rx) = mpsc::channel::<Ticket>();
            let out = answer_tx.clone();
            let floor = Arc::new(AtomicI64::new(i64::MIN));
            since.push(Arc::clone(&floor));
            std::thread::Builder::new()
                .name(format!("store-poller-{i}"))
                .spawn(move || {
                    // Ends when the tap drops its side (after its current poll: a store
                    // that never answers keeps it, and only it, until the process ends).
                    let mut series_epoch = None;
                    while let Ok(t) = rx.recv() {
                        if let Some((epoch, values)) = &t.series
                            && series_epoch != Some(*epoch)
                        {
                            store.set_series(Arc::clone(values));
                            series_epoch = Some(*epoch);
                        }
                        if t.resolve {
                            floor.store(i64::MAX, Relaxed);
                            let send_ns = realtime_ns();
                            let resolved = store.resolve_series();
                            let a = Answer {
                                poller: i,
                                send_ns,
                                resp_ns: realtime_ns(),
                                since_ns: None,
                                regular_since_ns: None,
                                catch_up: false,
                                newest_ns: t.newest_ns,
                                result: Ok(Batch::default()),
                                own_duration: None,
                                epoch: 0,
                                resolved: Some(resolved),
                                reconnections: store.reconnections(),
                            };
                            if out.send(a).is_err() {
                                return;
                            }
                            continue;
                        }
                        let send_ns = realtime_ns();
                        let regular_since_ns = store.since(t.newest_ns, send_ns, t.widen_ns);
                        let since_ns = if t.catch_up_ns > 0 {
                            store.since(
                                t.newest_ns,
                                send_ns,
                                t.widen_ns.saturating_add(t.catch_up_ns),
                            )
                        } else {
                            regular_since_ns
                        };
                        floor.store(since_ns.unwrap_or(i64::MIN), Relaxed);
                        let result = store.poll(since_ns);
                        let resp_ns = realtime_ns();
                        let own_duration = result.is_ok().then(|| store.sample_own_duration());
                        let a = Answer {
                            poller: i,
                            send_ns,
                            resp_ns,
                            since_ns,
                            regular_since_ns,
                            catch_up: t.catch_up_ns > 0,
                            newest_ns: t.newest_ns,
                            result,
                            own_duration,
                            epoch: t.series.as_ref().map_or(0, |s| s.0),
                            resolved: None,
                            reconnections: store.reconnections(),
                        };
                        if out.send(a).is_err() {
                            return;
                        }
                    }
                })?;
            tickets.push(tx);
        }
        let free = (0..tickets.len()).rev().collect();
        Ok(Self {
            tickets,
            answers,
            answer_tx,
            free,
            since,
        })
    }

    /// Where a listener sends the answers it makes of notifications.
    pub(crate) fn sender(&self) -> Sender<Answer> {
        self.answer_tx.clone()
    }

    /// Whether a poller is free to send a poll.
    pub(crate) fn any_free(&self) -> bool {
        !self.free.is_empty()
    }

    /// Polls in flight.
    pub(crate) fn in_flight(&self) -> usize {
        self.tickets.len() - self.free.len()
    }

    /// Hands `ticket` to a free poller; false when none is free (or its thread is gone).
    pub(crate) fn send(&mut self, ticket: Ticket) -> bool {
        let Some(i) = self.free.pop() else {
            return false;
        };
        self.since[i].store(i64::MIN, Relaxed);
        if self.tickets[i].send(ticket).is_err() {
            return false;
        }
        true
    }

    /// The lowest row time a poll still in flight may return (`i64::MAX` when none is in
    /// flight): keys at or after it must stay known, or that poll's answer would report
    /// them again.
    pub(crate) fn lowest_since_in_flight(&self) -> i64 {
        (0..self.tickets.len())
            .filter(|i| !self.free.contains(i))
            .map(|i| self.since[i].load(Relaxed))
            .min()
            .unwrap_or(i64::MAX)
    }

    /// The next answer, waiting at most `timeout`; its poller is free again.
    pub(crate) fn recv(&mut self, timeout: Duration) -> Option<Answer> {
        match self.answers.recv_timeout(timeout) {
            Ok(a) => {
                if a.poller != NOTIFIER {
                    self.free.push(a.poller);
                }
                Some(a)
            }
            Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => None,
        }
    }
}
