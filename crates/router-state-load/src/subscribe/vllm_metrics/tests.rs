//! vLLM `/metrics` mapping: a real engine's scrape, data-parallel engines, older series names,
//! and every way a scrape is refused.

use proptest::prelude::*;

use super::*;

/// A real vLLM 0.32.0 `/metrics` body (idle, one engine, 160 blocks of 32 = 5120 KV tokens).
const REAL: &str = include_str!("../../../testdata/vllm_metrics.txt");

const ENGINE0: &str = r#"{engine="0",model_name="tiny"}"#;

/// The real scrape with the load gauges of engine 0 replaced.
fn real_with(running: &str, waiting: &str, usage: &str) -> String {
    REAL.replace(
        &format!("vllm:num_requests_running{ENGINE0} 0.0"),
        &format!("vllm:num_requests_running{ENGINE0} {running}"),
    )
    .replace(
        &format!("vllm:num_requests_waiting{ENGINE0} 0.0"),
        &format!("vllm:num_requests_waiting{ENGINE0} {waiting}"),
    )
    .replace(
        &format!("vllm:kv_cache_usage_perc{ENGINE0} 0.0"),
        &format!("vllm:kv_cache_usage_perc{ENGINE0} {usage}"),
    )
}

/// A hand-written scrape of `engines` (engine index, running, waiting, usage, capacity label).
fn scrape(engines: &[(&str, &str, &str, &str, Option<&str>)]) -> String {
    let mut body = String::from(
        "# HELP vllm:num_requests_running Number of requests in model execution batches.\n\
         # TYPE vllm:num_requests_running gauge\n",
    );
    for (engine, running, waiting, usage, capacity) in engines {
        let labels = format!(r#"{{engine="{engine}",model_name="m"}}"#);
        body.push_str(&format!("vllm:num_requests_running{labels} {running}\n"));
        body.push_str(&format!("vllm:num_requests_waiting{labels} {waiting}\n"));
        body.push_str(&format!("vllm:kv_cache_usage_perc{labels} {usage}\n"));
        if let Some(capacity) = capacity {
            body.push_str(&format!(
                "vllm:cache_config_info{{block_size=\"16\",engine=\"{engine}\",\
                 kv_cache_size_tokens=\"{capacity}\",num_gpu_blocks=\"8\"}} 1.0\n"
            ));
        }
    }
    body
}

#[test]
fn reads_a_real_idle_engine() {
    let metrics = parse_vllm_metrics(REAL.as_bytes()).expect("a real scrape");
    assert_eq!(metrics.instance_id, Some(1_796_645_376_180));
    assert_eq!(metrics.engines, vec![0]);
    assert_eq!(metrics.ranks, vec![RankSample::basic(0, 0, 0, 0, 5_120)]);
}

#[test]
fn reads_a_real_busy_engine_as_used_tokens_of_the_capacity() {
    let body = real_with("3.0", "12.0", "0.25");
    let metrics = parse_vllm_metrics(body.as_bytes()).expect("valid");
    assert_eq!(metrics.ranks, vec![RankSample::basic(0, 3, 12, 1_280, 5_120)]);
}

#[test]
fn maps_engines_in_ascending_order_to_ranks() {
    let cases: &[(&[&str], &[u32])] = &[
        (&["0"], &[0]),
        (&["1", "0"], &[0, 1]),
        (&["3"], &[3]),
        (&["7", "4", "6", "5"], &[4, 5, 6, 7]),
    ];
    for (order, engines) in cases {
        let rows: Vec<_> =
            order.iter().map(|engine| (*engine, *engine, "1", "0.5", Some("1000"))).collect();
        let metrics = parse_vllm_metrics(scrape(&rows).as_bytes()).expect("valid");
        assert_eq!(metrics.engines, *engines, "{order:?}");
        for (rank, sample) in metrics.ranks.iter().enumerate() {
            assert_eq!(sample.dp_rank as usize, rank, "{order:?}");
            let engine = u64::from(engines[rank]);
            assert_eq!(sample.running_requests, engine, "rank {rank} is engine {engine}");
            assert_eq!((sample.kv_used_tokens, sample.kv_capacity_tokens), (500, 1000));
        }
        assert_eq!(metrics.instance_id, None, "no process_start_time_seconds");
    }
}

#[test]
fn capacity_comes_from_the_cache_config_labels() {
    let row = |labels: &str| {
        format!(
            "vllm:num_requests_running{{engine=\"0\"}} 1\n\
             vllm:num_requests_waiting{{engine=\"0\"}} 0\n\
             vllm:kv_cache_usage_perc{{engine=\"0\"}} 0.5\n{labels}"
        )
    };
    let cases = [
        (
            r#"vllm:cache_config_info{engine="0",kv_cache_size_tokens="900",num_gpu_blocks="8",block_size="16"} 1.0"#,
            900,
        ),
        (
            r#"vllm:cache_config_info{engine="0",kv_cache_size_tokens="None",num_gpu_blocks="8",block_size="16"} 1.0"#,
            128,
        ),
        (r#"vllm:cache_config_info{engine="0",num_gpu_blocks="8",block_size="16"} 1.0"#, 128),
        (r#"vllm:cache_config_info{engine="0",num_gpu_blocks="None",block_size="16"} 1.0"#, 0),
        (r#"vllm:cache_config_info{engine="0",num_gpu_blocks="-8",block_size="16"} 1.0"#, 0),
        (
            r#"vllm:cache_config_info{engine="0",num_gpu_blocks="18446744073709551615",block_size="16"} 1.0"#,
            0,
        ),
        (r#"vllm:cache_config_info{engine="1",kv_cache_size_tokens="900"} 1.0"#, 0),
        ("", 0),
    ];
    for (labels, capacity) in cases {
        let metrics = parse_vllm_metrics(row(labels).as_bytes()).expect(labels);
        let rank = metrics.ranks[0];
        assert_eq!(rank.kv_capacity_tokens, capacity, "{labels}");
        assert_eq!(rank.kv_used_tokens, capacity / 2, "{labels}");
    }
}

#[test]
fn reads_older_series_and_unlabelled_engines() {
    let cases = [
        // vLLM before the rename: only gpu_cache_usage_perc.
        (
            "vllm:num_requests_running{engine=\"0\"} 2\nvllm:num_requests_waiting{engine=\"0\"} 1\n\
             vllm:gpu_cache_usage_perc{engine=\"0\"} 1.0\n\
             vllm:cache_config_info{engine=\"0\",num_gpu_blocks=\"10\",block_size=\"16\"} 1\n",
            RankSample::basic(0, 2, 1, 160, 160),
        ),
        // Both: the new name wins.
        (
            "vllm:num_requests_running 2\nvllm:num_requests_waiting 1\n\
             vllm:kv_cache_usage_perc 0.5\nvllm:gpu_cache_usage_perc 1.0\n\
             vllm:cache_config_info{num_gpu_blocks=\"10\",block_size=\"16\"} 1\n",
            RankSample::basic(0, 2, 1, 80, 160),
        ),
        // Float noise just above 1, an integral float in exponent form, a timestamp.
        (
            "vllm:num_requests_running{engine=\"0\"} 2e1 1712345678\n\
             vllm:num_requests_waiting{engine=\"0\"} 0\n\
             vllm:kv_cache_usage_perc{engine=\"0\"} 1.0000001\n",
            RankSample::basic(0, 20, 0, 0, 0),
        ),
    ];
    for (body, rank) in cases {
        let metrics = parse_vllm_metrics(body.as_bytes()).expect(body);
        assert_eq!(metrics.ranks, vec![rank], "{body}");
    }
}

#[test]
fn refuses_scrapes_that_state_no_usable_load() {
    let two = |second: &str| {
        format!(
            "vllm:num_requests_running{{engine=\"0\"}} 1\nvllm:num_requests_waiting{{engine=\"0\"}} 1\n\
             vllm:kv_cache_usage_perc{{engine=\"0\"}} 0.1\n{second}"
        )
    };
    let cases: Vec<(String, VllmMetricsError)> = vec![
        (String::new(), VllmMetricsError::NotVllm),
        ("<html>404</html>".to_owned(), VllmMetricsError::NotVllm),
        (
            "# TYPE sglang:num_running_reqs gauge\nsglang:num_running_reqs 3\nprocess_start_time_seconds 1.7e9\n"
                .to_owned(),
            VllmMetricsError::NotVllm,
        ),
        (
            REAL.replace(&format!("vllm:num_requests_waiting{ENGINE0} 0.0\n"), ""),
            VllmMetricsError::MissingSeries { engine: 0, series: WAITING },
        ),
        (
            REAL.replace(&format!("vllm:kv_cache_usage_perc{ENGINE0} 0.0\n"), ""),
            VllmMetricsError::MissingSeries { engine: 0, series: KV_USAGE },
        ),
        (
            two("vllm:num_requests_running{engine=\"1\"} 1\n"),
            VllmMetricsError::MissingSeries { engine: 1, series: WAITING },
        ),
        (
            two("vllm:num_requests_running{engine=\"0\",model_name=\"other\"} 1\n"),
            VllmMetricsError::Duplicate { series: RUNNING, engine: 0 },
        ),
        (
            two("process_start_time_seconds 1.7e9\nprocess_start_time_seconds 1.8e9\n"),
            VllmMetricsError::Duplicate { series: PROCESS_START, engine: 0 },
        ),
        (
            two("vllm:num_requests_running{engine=\"dp1\"} 1\n"),
            VllmMetricsError::BadEngine { series: RUNNING, value: "dp1".to_owned() },
        ),
        (
            two("vllm:cache_config_info{engine=\"\"} 1\n"),
            VllmMetricsError::BadEngine { series: CACHE_CONFIG, value: String::new() },
        ),
        (
            two("vllm:num_requests_running{engine=\"99999999999\"} 1\n"),
            VllmMetricsError::BadEngine { series: RUNNING, value: "99999999999".to_owned() },
        ),
    ];
    for (body, want) in cases {
        let got = parse_vllm_metrics(body.as_bytes()).expect_err(&body);
        assert_eq!(got, want, "{body}");
        assert_eq!(got.reject_reason(), RejectReason::Malformed, "{got}");
    }
}

#[test]
fn refuses_nonsense_values_as_absurd() {
    let cases = [
        ("-1.0", "0.0", "0.0", RUNNING),
        ("NaN", "0.0", "0.0", RUNNING),
        ("+Inf", "0.0", "0.0", RUNNING),
        ("1.5", "0.0", "0.0", RUNNING),
        ("1e300", "0.0", "0.0", RUNNING),
        ("0.0", "-Inf", "0.0", WAITING),
        ("0.0", "0.0", "NaN", KV_USAGE),
        ("0.0", "0.0", "-0.01", KV_USAGE),
        ("0.0", "0.0", "1.5", KV_USAGE),
    ];
    for (running, waiting, usage, series) in cases {
        let body = real_with(running, waiting, usage);
        let got = parse_vllm_metrics(body.as_bytes()).expect_err(running);
        assert!(
            matches!(got, VllmMetricsError::Absurd { series: s, engine: 0, .. } if s == series),
            "{running} {waiting} {usage}: {got}"
        );
        assert_eq!(got.reject_reason(), RejectReason::AbsurdValue);
    }
    for start in ["NaN", "-1.0", "0", "+Inf", "1e12"] {
        let body = REAL.replace(
            "process_start_time_seconds 1.79664537618e+09",
            &format!("process_start_time_seconds {start}"),
        );
        let got = parse_vllm_metrics(body.as_bytes()).expect_err(start);
        assert!(
            matches!(got, VllmMetricsError::Absurd { series: PROCESS_START, .. }),
            "{start}: {got}"
        );
    }
}

#[test]
fn a_garbled_needed_line_is_a_syntax_error_and_other_lines_do_not_matter() {
    let body = REAL.replace(
        &format!("vllm:num_requests_running{ENGINE0} 0.0"),
        "vllm:num_requests_running{engine=\"0\",model_name=\"tiny} 0.0",
    );
    let got = parse_vllm_metrics(body.as_bytes()).expect_err("garbled");
    assert!(matches!(got, VllmMetricsError::Syntax(_)), "{got}");
    assert_eq!(got.reject_reason(), RejectReason::Malformed);

    let body =
        REAL.replace("python_gc_objects_collected_total{generation=\"0\"}", "python_gc{{{ \"");
    parse_vllm_metrics(body.as_bytes()).expect("an unneeded garbled line is skipped");
    let crlf = REAL.replace('\n', "\r\n");
    assert_eq!(
        parse_vllm_metrics(crlf.as_bytes()),
        parse_vllm_metrics(REAL.as_bytes()),
        "CRLF line ends read alike"
    );
}

#[test]
fn process_start_becomes_a_millisecond_instance_id() {
    let cases = [
        ("1.79664537618e+09", 1_796_645_376_180),
        ("1712345678.0004", 1_712_345_678_000),
        ("0.0001", 1),
    ];
    for (start, instance) in cases {
        let body = REAL.replace(
            "process_start_time_seconds 1.79664537618e+09",
            &format!("process_start_time_seconds {start}"),
        );
        let metrics = parse_vllm_metrics(body.as_bytes()).expect(start);
        assert_eq!(metrics.instance_id, Some(instance), "{start}");
    }
}

proptest! {
    #[test]
    fn any_bytes_give_a_load_or_a_reason_without_panic(body in proptest::collection::vec(any::<u8>(), 0..1024)) {
        let _ = parse_vllm_metrics(&body);
    }

    #[test]
    fn mutated_real_scrapes_give_a_sane_load_or_a_reason(
        cut in 0..REAL.len(),
        insert in proptest::collection::vec(any::<u8>(), 0..16),
    ) {
        let mut body = REAL.as_bytes().to_vec();
        body.splice(cut..cut, insert);
        if let Ok(metrics) = parse_vllm_metrics(&body) {
            prop_assert_eq!(metrics.ranks.len(), metrics.engines.len());
            for (rank, sample) in metrics.ranks.iter().enumerate() {
                prop_assert_eq!(sample.dp_rank as usize, rank);
                prop_assert!(sample.kv_used_tokens <= sample.kv_capacity_tokens);
            }
        }
    }
}
