//! Counter ids a store tap adds to its Counters frames (`docs/collector-protocol.md`).

/// Polls sent (answered or not).
pub const POLLS: u16 = 64;
/// Polls that failed (unreachable store, query error, unexpected answer).
pub const POLL_ERRORS: u16 = 65;
/// New keys reported (each once).
pub const KEYS_FOUND: u16 = 66;
/// Key values that did not decode as a trace context.
pub const BAD_KEYS: u16 = 67;
/// Rows returned with a key (new, repeated or bad).
pub const ROWS: u16 = 68;
/// Rows of keys already reported or already present at start (the overlap re-reads
/// them; a JSON batch stores one row per metric).
pub const ROWS_REPEATED: u16 = 69;
/// Rows without a key (data of untraced messages).
pub const UNTRACED_ROWS: u16 = 70;
/// Keys present when the tap started (not reported).
pub const BASELINE_KEYS: u16 = 71;
/// Keys of publishers not asked for (not reported).
pub const FOREIGN_KEYS: u16 = 72;
/// Sum over the keys found of their poll bracket, ns.
pub const BRACKET_SUM_NS: u16 = 73;
/// Largest poll bracket of a key found, ns.
pub const BRACKET_MAX_NS: u16 = 74;
/// P50 of the keys' poll brackets (HDR, 3 digits), ns.
pub const BRACKET_P50_NS: u16 = 75;
/// P99 of the keys' poll brackets (HDR, 3 digits), ns.
pub const BRACKET_P99_NS: u16 = 76;
/// Sum over the answered polls of response − send, ns.
pub const QUERY_TIME_SUM_NS: u16 = 77;
/// Polls answered (the denominator of the query time's mean).
pub const POLLS_ANSWERED: u16 = 78;
/// Sum of the query durations the store itself reported, ns.
pub const SERVER_ELAPSED_SUM_NS: u16 = 79;
/// Polls whose answer carried the store's own query duration.
pub const SERVER_ELAPSED_POLLS: u16 = 80;
/// Polls that found at least one new key.
pub const POLLS_WITH_KEYS: u16 = 81;
/// The configured poll interval, ns.
pub const POLL_INTERVAL_NS: u16 = 82;
/// Hop id of the stamp the bracket bounds (`queryable`).
pub const BRACKET_HOP: u16 = 83;
/// Keys forgotten before their window passed because the set was full (they may be
/// reported twice: the collector then counts a late record).
pub const KEYS_EVICTED_EARLY: u16 = 84;
/// P99 of the polls' query time (response − send), ns.
pub const QUERY_TIME_P99_NS: u16 = 85;
/// P50 of the polls' query time (HDR, 3 digits), ns.
pub const QUERY_TIME_P50_NS: u16 = 86;
/// Largest query time of a poll, ns.
pub const QUERY_TIME_MAX_NS: u16 = 87;
/// P50 of the query durations the store itself reported (HDR, 3 digits), ns.
pub const SERVER_ELAPSED_P50_NS: u16 = 88;
/// P99 of the query durations the store itself reported (HDR, 3 digits), ns.
pub const SERVER_ELAPSED_P99_NS: u16 = 89;
/// Largest query duration the store itself reported, ns.
pub const SERVER_ELAPSED_MAX_NS: u16 = 90;
/// Time since the tap began polling, ns (polls per second = polls / this).
pub const POLLING_NS: u16 = 91;
/// Keys whose earliest instant is their own store time (later than every poll that
/// covered them).
pub const EARLIEST_FROM_STORE_TIME: u16 = 92;
/// Keys no remembered poll covered: their earliest instant is their publish stamp.
pub const EARLIEST_FALLBACKS: u16 = 93;
/// Connections polling the store.
pub const POLLERS: u16 = 94;
/// New keys whose row time was older than the newest row time seen when the poll that
/// found them was sent: rows that became visible out of their time order.
pub const LATE_ROWS: u16 = 95;
/// The most such a row was behind that newest row time, ns.
pub const LATE_MAX_NS: u16 = 96;
/// How far behind the newest row time polls look now (the store's overlap, widened to
/// twice the latest lateness seen), ns.
pub const LOOK_BACK_NS: u16 = 97;
/// Catch-up polls sent: once a second while keys are found, a poll looks back the
/// catch-up window (counted in `polls` too).
pub const CATCH_UP_POLLS: u16 = 98;
/// Keys only a catch-up poll found: their rows became visible further behind the
/// newest row time than the regular polls looked.
pub const CAUGHT_UP_KEYS: u16 = 99;
/// The most such a row was behind the newest row time seen when its poll was sent, ns.
pub const CAUGHT_UP_LATE_MAX_NS: u16 = 100;
/// How far behind the newest row time catch-up polls look, ns (0: none are sent).
pub const CATCH_UP_NS: u16 = 101;
/// Series polled by value (InfluxDB `series=`), as resolved last.
pub const SERIES: u16 = 102;
/// Resolutions of the series (at start, then every 100 ms while new ones appear,
/// backing off to once a second).
pub const SERIES_RESOLUTIONS: u16 = 103;
/// Resolutions that failed (the tap polled on with the series it had).
pub const SERIES_RESOLUTION_ERRORS: u16 = 104;
/// New keys whose row time was after the response that returned them: a clock (the
/// store's, or the writer's that stamped the row) ahead of the tap's.
pub const STORE_TIME_AHEAD: u16 = 105;
/// The most such a row time was after its response, ns.
pub const STORE_TIME_AHEAD_MAX_NS: u16 = 106;
/// New keys whose row time was before their publish stamp by more than the row time's
/// resolution: a clock behind the publisher's, or a row time the writer took from the
/// message rather than the store's.
pub const STORE_TIME_BEHIND: u16 = 107;
/// The most such a row time was before its publish stamp, ns.
pub const STORE_TIME_BEHIND_MAX_NS: u16 = 108;
/// Connections to the store found lost and opened again, over all pollers (PostgreSQL;
/// 0 for the HTTP stores, whose client reconnects within a request).
pub const RECONNECTIONS: u16 = 109;
/// Notifications the tap's listener received (PostgreSQL `notify=`).
pub const NOTIFICATIONS: u16 = 110;
/// Keys a notification reported before any poll found them: their `queryable` is its
/// arrival and their `query_start` the same instant.
pub const KEYS_NOTIFIED: u16 = 111;
/// Notifications whose payload was not `KEY TIME_US`.
pub const BAD_NOTIFICATIONS: u16 = 112;
/// Listener connections that failed to open or were lost.
pub const LISTEN_ERRORS: u16 = 113;

/// The counter's name, or `None` for an id outside this list.
#[must_use]
pub fn name(id: u16) -> Option<&'static str> {
    Some(match id {
        POLLS => "polls",
        POLL_ERRORS => "poll_errors",
        KEYS_FOUND => "keys_found",
        BAD_KEYS => "bad_keys",
        ROWS => "rows",
        ROWS_REPEATED => "rows_repeated",
        UNTRACED_ROWS => "untraced_rows",
        BASELINE_KEYS => "baseline_keys",
        FOREIGN_KEYS => "foreign_keys",
        BRACKET_SUM_NS => "bracket_sum_ns",
        BRACKET_MAX_NS => "bracket_max_ns",
        BRACKET_P50_NS => "bracket_p50_ns",
        BRACKET_P99_NS => "bracket_p99_ns",
        QUERY_TIME_SUM_NS => "query_time_sum_ns",
        POLLS_ANSWERED => "polls_answered",
        SERVER_ELAPSED_SUM_NS => "server_elapsed_sum_ns",
        SERVER_ELAPSED_POLLS => "server_elapsed_polls",
        POLLS_WITH_KEYS => "polls_with_keys",
        POLL_INTERVAL_NS => "poll_interval_ns",
        BRACKET_HOP => "bracket_hop",
        KEYS_EVICTED_EARLY => "keys_evicted_early",
        QUERY_TIME_P99_NS => "query_time_p99_ns",
        QUERY_TIME_P50_NS => "query_time_p50_ns",
        QUERY_TIME_MAX_NS => "query_time_max_ns",
        SERVER_ELAPSED_P50_NS => "server_elapsed_p50_ns",
        SERVER_ELAPSED_P99_NS => "server_elapsed_p99_ns",
        SERVER_ELAPSED_MAX_NS => "server_elapsed_max_ns",
        POLLING_NS => "polling_ns",
        EARLIEST_FROM_STORE_TIME => "earliest_from_store_time",
        EARLIEST_FALLBACKS => "earliest_fallbacks",
        POLLERS => "pollers",
        LATE_ROWS => "late_rows",
        LATE_MAX_NS => "late_max_ns",
        LOOK_BACK_NS => "look_back_ns",
        CATCH_UP_POLLS => "catch_up_polls",
        CAUGHT_UP_KEYS => "caught_up_keys",
        CAUGHT_UP_LATE_MAX_NS => "caught_up_late_max_ns",
        CATCH_UP_NS => "catch_up_ns",
        SERIES => "series",
        SERIES_RESOLUTIONS => "series_resolutions",
        SERIES_RESOLUTION_ERRORS => "series_resolution_errors",
        STORE_TIME_AHEAD => "store_time_ahead",
        STORE_TIME_AHEAD_MAX_NS => "store_time_ahead_max_ns",
        STORE_TIME_BEHIND => "store_time_behind",
        STORE_TIME_BEHIND_MAX_NS => "store_time_behind_max_ns",
        RECONNECTIONS => "reconnections",
        NOTIFICATIONS => "notifications",
        KEYS_NOTIFIED => "keys_notified",
        BAD_NOTIFICATIONS => "bad_notifications",
        LISTEN_ERRORS => "listen_errors",
        _ => return None,
    })
}
