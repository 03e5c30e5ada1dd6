use super::*;

fn minimal() -> PipelineSpec {
    PipelineSpec::from_toml_str(
        r#"
        name = "p"
        [[hops]]
        name = "a"
        [[hops]]
        name = "b"
        [[stages]]
        name = "A to B"
        from = "a"
        to = "b"
        definition = "d"
        "#,
    )
    .unwrap()
}

/// The message of the error `edit` causes on the minimal spec.
fn error_of(edit: impl FnOnce(&mut PipelineSpec)) -> String {
    let mut spec = minimal();
    edit(&mut spec);
    spec.validate().unwrap_err().to_string()
}

fn hop(name: &str, id: Option<u8>) -> HopSpec {
    HopSpec {
        name: name.into(),
        id,
        description: String::new(),
        earliest: None,
        span: None,
    }
}

#[test]
fn default_pipeline_parses_validates_and_has_the_reference_stages() {
    let spec = PipelineSpec::default_pipeline();
    let resolved = spec.resolve().unwrap();
    assert_eq!(
        resolved.hop_names(),
        [
            "publish",
            "flow_in",
            "flow_out",
            "store_in",
            "query_start",
            "queryable"
        ]
    );
    for (i, id) in resolved.hop_ids().iter().enumerate() {
        assert_eq!(usize::from(id.0), i);
    }
    assert_eq!(resolved.expected_mask(), 0b11_1111);
    let stages: Vec<_> = resolved
        .stages()
        .iter()
        .map(|s| {
            (
                s.name.as_str(),
                resolved.hop_names()[s.from_index].as_str(),
                resolved.hop_names()[s.to_index].as_str(),
                s.headline,
            )
        })
        .collect();
    assert_eq!(
        stages,
        [
            ("Broker Time", "publish", "flow_in", false),
            ("Flow Internal", "flow_in", "flow_out", false),
            ("Transmission", "flow_out", "store_in", false),
            ("Total Ingestion", "publish", "queryable", true),
            ("Query Duration", "query_start", "queryable", true),
        ]
    );
    assert_eq!(
        resolved.stages()[0].definition,
        "Time from message publish, through the broker, to arrival in the processor."
    );
    assert!(spec.hops.iter().all(|h| !h.description.is_empty()));
    assert!(spec.stages.iter().all(|s| !s.definition.is_empty()));
    assert_eq!(spec.join, JoinSpec::default());
    assert_eq!(spec.output, OutputSpec::default());
}

#[test]
fn default_pipeline_round_trips_through_toml() {
    let spec = PipelineSpec::default_pipeline();
    let text = toml::to_string(&spec).unwrap();
    assert_eq!(PipelineSpec::from_toml_str(&text).unwrap(), spec);
    let mut with_expected = spec.clone();
    with_expected.expected = Some(vec!["publish".into(), "store_in".into()]);
    with_expected.hops[0].id = None;
    let text = toml::to_string(&with_expected).unwrap();
    assert_eq!(PipelineSpec::from_toml_str(&text).unwrap(), with_expected);
}

#[test]
fn default_toml_comments_every_field() {
    // Each `key = value` line of the first hop, first stage, [join] and [output]
    // (and the top-level keys) has a comment line right above it.
    let lines: Vec<&str> = DEFAULT_PIPELINE_TOML.lines().collect();
    let mut seen = HashSet::new();
    for (i, line) in lines.iter().enumerate() {
        let line = line.trim_start_matches("# ");
        let Some((key, _)) = line.split_once(" = ") else {
            continue;
        };
        if key.contains(' ') || !seen.insert(key.to_owned()) {
            continue;
        }
        assert!(
            lines[i - 1].starts_with('#'),
            "first `{key}` has no comment above it"
        );
    }
    for key in [
        "name",
        "expected",
        "id",
        "description",
        "from",
        "to",
        "definition",
        "headline",
        "window_ms",
        "max_pending",
        "plausible_window_s",
        "roll_rows",
        "roll_seconds",
        "row_group_rows",
        "zstd_level",
    ] {
        assert!(seen.contains(key), "`{key}` missing from the default spec");
    }
}

#[test]
fn defaults_apply_to_omitted_sections_and_ids() {
    let spec = minimal();
    assert_eq!(spec.join.window_ms, 10_000);
    assert_eq!(spec.join.max_pending, 2_000_000);
    assert_eq!(spec.output.roll_rows, 1_000_000);
    assert_eq!(spec.output.roll_seconds, 60);
    assert_eq!(spec.output.row_group_rows, 1_000_000);
    assert_eq!(spec.output.zstd_level, 1);
    let r = spec.resolve().unwrap();
    assert_eq!(r.hop_ids(), [HopId(0), HopId(1)]);
    assert_eq!(r.window_ns(), 10_000_000_000);
    assert_eq!(r.max_pending(), 2_000_000);
    assert!(!r.stages()[0].headline);
}

#[test]
fn hop_index_maps_wire_ids_and_expected_mask_uses_indices() {
    let mut spec = minimal();
    spec.hops = vec![hop("x", Some(200)), hop("y", None), hop("z", Some(7))];
    spec.stages.clear();
    spec.expected = Some(vec!["z".into(), "x".into()]);
    let r = spec.resolve().unwrap();
    assert_eq!(r.hop_index(HopId(200)), Some(0));
    assert_eq!(r.hop_index(HopId(1)), Some(1));
    assert_eq!(r.hop_index(HopId(7)), Some(2));
    assert_eq!(r.hop_index(HopId(0)), None);
    assert_eq!(r.hop_index(HopId(2)), None);
    assert_eq!(r.expected_mask(), 0b101);
    assert_eq!(r.all_hops_mask(), 0b111);
    assert_eq!(r.mask_names(0b110), ["y", "z"]);
}

#[test]
fn a_hop_without_an_id_takes_its_index_wherever_it_is_asked() {
    let mut spec = minimal();
    spec.name = "p".into();
    spec.hops = vec![hop("x", Some(200)), hop("y", None), hop("z", Some(7))];
    spec.stages.clear();
    assert_eq!(
        spec.hop_ids().collect::<Vec<_>>(),
        [("x", HopId(200)), ("y", HopId(1)), ("z", HopId(7))]
    );
    let r = spec.resolve().unwrap();
    for name in ["x", "y", "z"] {
        assert_eq!(spec.hop(name), r.hop(name));
    }
    assert_eq!(spec.hop("w"), None);
    assert_eq!(r.hop("w"), None);
    assert_eq!(
        spec.undeclared("w"),
        r#"hop "w" is not declared by the pipeline "p" (x, y, z)"#
    );
}

#[test]
fn sixteen_hops_are_allowed_and_seventeen_are_not() {
    let mut spec = minimal();
    spec.hops = (0..16).map(|i| hop(&format!("h{i}"), None)).collect();
    spec.stages[0].from = "h0".into();
    spec.stages[0].to = "h15".into();
    let r = spec.resolve().unwrap();
    assert_eq!(r.expected_mask(), u16::MAX);
    assert_eq!(r.all_hops_mask(), u16::MAX);
    spec.hops.push(hop("h16", None));
    let msg = spec.validate().unwrap_err().to_string();
    assert!(msg.contains("17 hops"), "{msg}");
}

#[test]
fn no_hops_is_refused() {
    let msg = error_of(|s| s.hops.clear());
    assert!(msg.contains("`hops` declares 0 hops"), "{msg}");
}

#[test]
fn empty_pipeline_name_is_refused() {
    let msg = error_of(|s| s.name = " ".into());
    assert!(msg.contains("`name` is empty"), "{msg}");
}

#[test]
fn empty_hop_name_is_refused() {
    let msg = error_of(|s| s.hops[1].name.clear());
    assert_eq!(msg, "hop #1: `name` is empty");
}

#[test]
fn bad_hop_names_are_refused() {
    for bad in ["Flow_In", "flow-in", "flow in", "flöw"] {
        let msg = error_of(|s| s.hops[1].name = bad.into());
        assert!(msg.contains(&format!("hop \"{bad}\"")), "{msg}");
        assert!(msg.contains("a-z, 0-9 and _"), "{msg}");
    }
}

#[test]
fn a_stage_column_that_clashes_is_refused() {
    let msg = error_of(|s| s.stages[0].name = "B".into());
    assert_eq!(
        msg,
        "stage \"B\": its column `b_ns` would clash with hop \"b\"; rename the stage"
    );
    let msg = error_of(|s| s.stages[0].name = "Intended".into());
    assert!(msg.contains("the trace column `intended_ns`"), "{msg}");
    let msg = error_of(|s| {
        let mut other = s.stages[0].clone();
        other.name = "a to b".into();
        s.stages.push(other);
    });
    assert!(msg.contains("stage \"A to B\""), "{msg}");
}

#[test]
fn duplicate_hop_name_is_refused() {
    let msg = error_of(|s| s.hops[1].name = "a".into());
    assert_eq!(msg, "hop \"a\" is declared twice");
}

#[test]
fn duplicate_hop_ids_are_refused_explicit_or_defaulted() {
    let msg = error_of(|s| s.hops[1].id = Some(0));
    assert_eq!(
        msg,
        "hop \"b\": `id` 0 is already used by hop \"a\" (its position in [[hops]], as it gives no `id`): give one of them another `id` (0-255)"
    );
    let msg = error_of(|s| s.hops[0].id = Some(1));
    assert_eq!(
        msg,
        "hop \"b\": `id` 1 (its position in [[hops]], counting from 0: a hop without `id` takes its position) is already used by hop \"a\": give one of them another `id` (0-255)"
    );
}

#[test]
fn a_hop_id_out_of_range_says_the_range() {
    let text = "name = \"p\"\n[[hops]]\nname = \"a\"\nid = 300\n[[hops]]\nname = \"b\"\n";
    let e = PipelineSpec::from_toml_str(text).unwrap_err().to_string();
    assert!(e.contains("0-255") && e.contains("300"), "{e}");
    assert!(!e.contains("expected u8"), "{e}");
}

#[test]
fn expected_must_name_declared_hops_once() {
    let msg = error_of(|s| s.expected = Some(vec!["a".into(), "c".into()]));
    assert_eq!(msg, "`expected`: hop \"c\" is not declared (hops: a, b)");
    let msg = error_of(|s| s.expected = Some(vec!["a".into(), "a".into()]));
    assert_eq!(msg, "`expected` lists hop \"a\" twice");
    let msg = error_of(|s| s.expected = Some(vec![]));
    assert!(msg.starts_with("`expected` is empty"), "{msg}");
}

#[test]
fn stage_names_must_be_non_empty_and_unique() {
    let msg = error_of(|s| s.stages[0].name = String::new());
    assert_eq!(msg, "stage #0: `name` is empty");
    let msg = error_of(|s| {
        let again = s.stages[0].clone();
        s.stages.push(again);
    });
    assert_eq!(msg, "stage \"A to B\" is declared twice");
}

#[test]
fn stage_hops_must_exist_and_differ() {
    let msg = error_of(|s| s.stages[0].from = "aa".into());
    assert_eq!(
        msg,
        "stage \"A to B\": `from` hop \"aa\" is not declared (hops: a, b)"
    );
    let msg = error_of(|s| s.stages[0].to = "flow_inn".into());
    assert_eq!(
        msg,
        "stage \"A to B\": `to` hop \"flow_inn\" is not declared (hops: a, b)"
    );
    let msg = error_of(|s| s.stages[0].to = "a".into());
    assert!(
        msg.starts_with("stage \"A to B\": `from` and `to` are both \"a\""),
        "{msg}"
    );
}

#[test]
fn zero_settings_are_refused() {
    type Edit = fn(&mut PipelineSpec);
    let cases: [(&str, Edit); 5] = [
        ("join.window_ms", |s| s.join.window_ms = 0),
        ("join.max_pending", |s| s.join.max_pending = 0),
        ("output.roll_rows", |s| s.output.roll_rows = 0),
        ("output.roll_seconds", |s| s.output.roll_seconds = 0),
        ("output.row_group_rows", |s| s.output.row_group_rows = 0),
    ];
    for (field, edit) in cases {
        assert_eq!(
            error_of(edit),
            format!("`{field}` is 0; it must be greater than 0")
        );
    }
}

#[test]
fn zstd_level_must_be_1_to_22() {
    for level in [0, 23, -1] {
        let msg = error_of(|s| s.output.zstd_level = level);
        assert!(
            msg.starts_with(&format!("`output.zstd_level` is {level};")),
            "{msg}"
        );
    }
    for level in [1, 22] {
        let mut spec = minimal();
        spec.output.zstd_level = level;
        spec.validate().unwrap();
    }
}

#[test]
fn toml_syntax_errors_keep_line_and_column() {
    let err = PipelineSpec::from_toml_str("name = \"p\"\n[[hops]\nname = \"a\"\n").unwrap_err();
    assert!(matches!(err, SpecError::Toml(_)));
    let msg = err.to_string();
    assert!(msg.contains("line 2"), "{msg}");
    assert!(msg.contains("column"), "{msg}");
}

#[test]
fn unknown_and_missing_fields_are_refused() {
    let text = DEFAULT_PIPELINE_TOML.replace("window_ms = 10000", "window_s = 10");
    let msg = PipelineSpec::from_toml_str(&text).unwrap_err().to_string();
    assert!(msg.contains("window_s"), "{msg}");
    let text = DEFAULT_PIPELINE_TOML.replace("definition = \"Processing", "defn = \"P");
    let msg = PipelineSpec::from_toml_str(&text).unwrap_err().to_string();
    assert!(msg.contains("defn"), "{msg}");
    let msg = PipelineSpec::from_toml_str("name = \"p\"\nstages = []\n")
        .unwrap_err()
        .to_string();
    assert!(msg.contains("hops"), "{msg}");
}

#[test]
fn id_out_of_range_is_a_toml_error() {
    let text = DEFAULT_PIPELINE_TOML.replace("id = 5", "id = 256");
    let err = PipelineSpec::from_toml_str(&text).unwrap_err();
    assert!(matches!(err, SpecError::Toml(_)), "{err}");
}

#[test]
fn load_reads_a_file_and_names_it_when_it_cannot() {
    let dir = std::env::temp_dir().join(format!("hoptrace-spec-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("pipeline.toml");
    std::fs::write(&path, DEFAULT_PIPELINE_TOML).unwrap();
    assert_eq!(
        PipelineSpec::load(&path).unwrap(),
        PipelineSpec::default_pipeline()
    );
    let missing = dir.join("missing.toml");
    let err = PipelineSpec::load(&missing).unwrap_err();
    assert!(matches!(err, SpecError::Read { .. }));
    assert!(err.to_string().contains("missing.toml"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_span_match_parses_and_says_what_is_wrong_with_it() {
    let spec = PipelineSpec::from_toml_str(
        r#"
        name = "otel"
        [[hops]]
        name = "publish"
        [[hops]]
        name = "flow_in"
        span = { service = "mirror", kind = "consumer", name = "* process", attributes = { "messaging.destination.name" = "orders" } }
        [[hops]]
        name = "flow_out"
        span = { service = "mirror", kind = "consumer", name = "* process", stamp = "end" }
        [[stages]]
        name = "Flow Internal"
        from = "flow_in"
        to = "flow_out"
        definition = "d"
        "#,
    )
    .unwrap();
    spec.validate().unwrap();
    let m = spec.hops[1].span.as_ref().unwrap();
    assert_eq!(m.kind_number(), Some(5));
    assert!(!m.stamps_end());
    assert!(spec.hops[2].span.as_ref().unwrap().stamps_end());
    assert!(m.name_fits("orders process"));
    assert!(!m.name_fits("orders receive"));
    let text = toml::to_string(&spec).unwrap();
    assert_eq!(PipelineSpec::from_toml_str(&text).unwrap(), spec);

    let bad = |m: SpanMatch| error_of(|s| s.hops[0].span = Some(m));
    assert!(
        bad(SpanMatch {
            kind: Some("queue".into()),
            stamp: "start".into(),
            ..SpanMatch::default()
        })
        .contains("`kind` \"queue\" is not one of internal, server, client, producer, consumer")
    );
    assert!(
        bad(SpanMatch {
            name: Some("x".into()),
            stamp: "middle".into(),
            ..SpanMatch::default()
        })
        .contains("`stamp` \"middle\" is neither")
    );
    assert!(
        bad(SpanMatch {
            stamp: "start".into(),
            ..SpanMatch::default()
        })
        .contains("hop \"a\": `span` matches every span")
    );
}

#[test]
fn a_span_name_pattern_takes_any_run_for_a_star() {
    let fits = |p: &str, t: &str| {
        SpanMatch {
            name: Some(p.into()),
            ..SpanMatch::default()
        }
        .name_fits(t)
    };
    assert!(fits("orders publish", "orders publish"));
    assert!(!fits("orders publish", "orders publish2"));
    assert!(fits("*", ""));
    assert!(fits("* process", "a.b process"));
    assert!(fits("*ord*s*", "orders"));
    assert!(fits("a*b*c", "aXbYbZc"));
    assert!(!fits("a*b*c", "aXbYbZ"));
    assert!(!fits("", "x"));
}

#[test]
fn the_otel_example_parses_with_a_span_match_on_every_hop_past_the_publisher() {
    let spec = PipelineSpec::from_toml_str(OTEL_PIPELINE_TOML).unwrap();
    let resolved = spec.resolve().unwrap();
    assert_eq!(resolved.hop_names().len(), 5);
    assert!(spec.hops[0].span.is_none());
    assert!(spec.hops[1..].iter().all(|h| h.span.is_some()));
    assert!(spec.hops[4].span.as_ref().unwrap().stamps_end());
}
