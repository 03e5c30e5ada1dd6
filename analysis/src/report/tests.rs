use super::blocks::{date_of, poll_bracket_row, store_tap_blocks, store_time_disagrees};
use super::*;
use crate::summary::{PollBracket, PolledEnd, StoreTapCost};

/// A tap whose row times were off its clock gets a paragraph that says how many, by
/// how much, and what that does to the figures; one whose were not gets none.
#[test]
fn row_times_off_the_taps_clock_are_said_beside_its_cost() {
    let mut t = StoreTapCost::example();
    assert!(store_time_disagrees(&t).is_none());
    t.store_time_ahead = (40, 4_991_894_926);
    t.store_time_behind = (2, 20_000_000);
    let Some(Block::Para(p)) = store_time_disagrees(&t) else {
        panic!("no paragraph")
    };
    assert!(
        p.contains("40 rows carried a time after the response"),
        "{p}"
    );
    assert!(
        p.contains("2 rows carried a time before their message was published"),
        "{p}"
    );
    assert!(p.contains("no longer bounds `queryable` from below"), "{p}");
    assert_eq!(
        store_tap_blocks(&[t]).len(),
        4,
        "heading, text, table, paragraph"
    );
}

#[test]
fn dates_are_utc_civil() {
    assert_eq!(date_of(0), "1970-01-01 00:00:00 UTC");
    assert_eq!(
        date_of(1_776_124_800_000_000_000),
        "2026-04-14 00:00:00 UTC"
    );
    assert_eq!(date_of(951_782_400_000_000_000), "2000-02-29 00:00:00 UTC");
}

fn bracket(end: PolledEnd, warning: bool) -> PollBracket {
    PollBracket {
        hop: "queryable".into(),
        end,
        keys: 60_000,
        mean_ns: 13_500_000.0,
        p50_ns: 10_000_000,
        p99_ns: 51_500_000,
        max_ns: 191_300_000,
        poll_interval_ns: 10_000_000,
        polls: 29_400,
        poll_errors: 2,
        warning,
    }
}

#[test]
fn the_poll_bracket_row_bounds_by_the_max_signed_by_the_stage_end() {
    let row = poll_bracket_row(&bracket(PolledEnd::To, true));
    assert_eq!(row[0], "Poll bracket");
    // The largest bracket bounds every stamp; a stage ending at the polled hop is long.
    assert_eq!(row[1], "+0/−191.3ms");
    for part in [
        "ends at queryable",
        "measured long by up to max 191.3ms",
        "P50 10.0ms, P99 51.5ms, mean 13.5ms over 60,000 keys",
        "29,400 polls, 2 failed",
        "WARNING: P99 not small against P50",
    ] {
        assert!(row[2].contains(part), "{part:?} in {}", row[2]);
    }
    // A stage starting at the polled hop is measured short: the true value is larger.
    let row = poll_bracket_row(&bracket(PolledEnd::From, false));
    assert_eq!(row[1], "+191.3ms/−0");
    assert!(row[2].contains("starts at queryable"), "{}", row[2]);
    assert!(row[2].contains("measured short"), "{}", row[2]);
    assert!(!row[2].contains("WARNING"), "{}", row[2]);
}

#[test]
fn markdown_tables_escape_pipes() {
    let b = [Block::Table(vec!["a".into()], vec![vec!["x|y".into()]])];
    let md = markdown(&b, &[]);
    assert!(md.contains("x\\|y"), "{md}");
}

#[test]
fn anchors_are_githubs_and_unique() {
    assert_eq!(
        slug("Broker Time (flow_in − publish)"),
        "broker-time-flow_in--publish"
    );
    assert_eq!(slug("1) Latency Histograms"), "1-latency-histograms");
    let b = [
        Block::Heading(1, "T".into()),
        Block::Para("x".into()),
        Block::Heading(2, "A b".into()),
        Block::Heading(2, "A b".into()),
    ];
    assert_eq!(
        anchors(&b),
        [
            Some("t".into()),
            None,
            Some("a-b".into()),
            Some("a-b-1".into())
        ]
    );
}

#[test]
fn contents_link_every_section_in_both_forms() {
    let b = [
        Block::Heading(1, "Report".into()),
        Block::Heading(2, "One".into()),
        Block::Heading(3, "Sub <1>".into()),
        Block::Heading(3, "Sub 2".into()),
        Block::Heading(2, "Two".into()),
        Block::Heading(2, "One".into()),
    ];
    let md = markdown(&b, &[]);
    for line in [
        "- [One](#one)",
        "  - [Sub <1>](#sub-1)",
        "  - [Sub 2](#sub-2)",
        "- [Two](#two)",
        "- [One](#one-1)",
    ] {
        assert!(md.contains(&format!("{line}\n")), "{line}:\n{md}");
    }
    let page = html(&b, &[], "t", &[]);
    for id in ["one", "sub-1", "sub-2", "two", "one-1"] {
        assert!(page.contains(&format!("<a href=\"#{id}\">")), "{id}");
        assert!(page.contains(&format!(" id=\"{id}\">")), "{id}");
    }
    assert!(page.contains("&lt;1&gt;"));
    // Lists are balanced.
    assert_eq!(page.matches("<ul>").count(), page.matches("</ul>").count());
    assert_eq!(page.matches("<li>").count(), page.matches("</li>").count());
    // A page with one section has none.
    let short = [
        Block::Heading(1, "R".into()),
        Block::Heading(2, "Only".into()),
    ];
    assert!(!markdown(&short, &[]).contains("Contents"));
}

#[test]
fn html_escapes_text_and_script_ends() {
    let b = [Block::Para("<b>&</b>".into())];
    let page = html(&b, &[], "t", &["x('</script>')".into()]);
    assert!(page.contains("&lt;b&gt;&amp;&lt;/b&gt;"));
    assert!(!page.contains("x('</script>')"));
}
