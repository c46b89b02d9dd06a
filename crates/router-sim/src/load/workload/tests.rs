use super::*;

#[test]
fn text_is_exactly_as_long_as_asked_and_deterministic() {
    for len in [0, 1, 5, 64, 513] {
        let t = text(7, len);
        assert_eq!(t.len(), len);
        assert!(t.is_ascii());
        assert_eq!(t, text(7, len));
    }
    assert_ne!(text(7, 64), text(8, 64));
}

#[test]
fn sessions_share_system_prompts_round_robin() {
    let spec = SessionSpec {
        sessions: 5,
        system_prompts: 2,
        system_prompt_tokens: 40,
        ..SessionSpec::default()
    };
    let sessions = Session::all(&spec);
    let system = |s: &Session| s.next_turn().0[0].content.clone();
    assert_eq!(system(&sessions[0]), system(&sessions[2]));
    assert_eq!(system(&sessions[1]), system(&sessions[3]));
    assert_ne!(system(&sessions[0]), system(&sessions[1]));
    assert_eq!(system(&sessions[0]).len(), 40);
    assert_ne!(sessions[0].next_turn().1, sessions[2].next_turn().1, "user turns differ");
}

#[test]
fn answered_turns_extend_the_history_and_failed_ones_do_not() {
    let spec = SessionSpec { sessions: 1, turns: 3, turn_tokens: 10, ..SessionSpec::default() };
    let mut session = Session::all(&spec).remove(0);
    let (first, user) = session.next_turn();
    assert_eq!(first.len(), 2);
    session.record(user.clone(), Some("answer one".into()));
    let (second, user2) = session.next_turn();
    assert_eq!(second.len(), 4);
    assert_eq!(second[..2], first[..]);
    assert_eq!(second[2], Message { role: "assistant", content: "answer one".into() });
    assert_ne!(user2, user);
    session.record(user2, None);
    let (third, _) = session.next_turn();
    assert_eq!(third.len(), 4, "the failed turn left no trace");
    assert!(!session.finished());
    session.record(Message { role: "user", content: String::new() }, None);
    assert!(session.finished());
}

fn write_trace(lines: &[&str]) -> std::path::PathBuf {
    let path = std::env::temp_dir().join(format!(
        "router-sim-trace-{}-{}.jsonl",
        std::process::id(),
        lines.len()
    ));
    std::fs::write(&path, lines.join("\n")).expect("write trace");
    path
}

#[test]
fn traces_parse_scale_and_compute_the_oracle() {
    let path = write_trace(&[
        r#"{"timestamp": 0, "input_length": 1000, "output_length": 5, "hash_ids": [0, 1]}"#,
        r#"{"timestamp": 100, "input_length": 1500, "output_length": 7, "hash_ids": [0, 1, 2]}"#,
        "",
        r#"{"timestamp": 250, "input_length": 600, "output_length": 1, "hash_ids": [0, 3]}"#,
        r#"{"timestamp": 300, "input_length": 10, "output_length": 1, "hash_ids": [9]}"#,
    ]);
    let spec =
        TraceSpec { path: path.clone(), time_scale: 0.5, max_requests: Some(3), block_tokens: 512 };
    let requests = read_trace(&spec).expect("reads");
    assert_eq!(requests.len(), 3);
    assert_eq!(requests[1].at, Duration::from_millis(50));
    assert_eq!(requests[2].at, Duration::from_millis(125));
    // Blocks: [0,1] none seen; [0,1,2] two seen; [0,3] one seen: 3 hits of 7.
    assert_eq!(oracle_hit_rate(&requests), Some(3.0 / 7.0));
    std::fs::remove_file(path).expect("cleanup");
}

#[test]
fn trace_prompts_share_text_for_shared_hash_ids() {
    let a = TraceRequest {
        at: Duration::ZERO,
        input_length: 1000,
        output_length: 1,
        hash_ids: vec![0, 1],
    };
    let b = TraceRequest {
        at: Duration::ZERO,
        input_length: 1500,
        output_length: 1,
        hash_ids: vec![0, 1, 2],
    };
    let c = TraceRequest {
        at: Duration::ZERO,
        input_length: 700,
        output_length: 1,
        hash_ids: vec![0, 3],
    };
    let (pa, pb, pc) = (a.prompt(512), b.prompt(512), c.prompt(512));
    assert_eq!((pa.len(), pb.len(), pc.len()), (1000, 1500, 700));
    assert_eq!(pa[..1000], pb[..1000]);
    assert_eq!(pa[..512], pc[..512]);
    assert_ne!(pa[512..700], pc[512..700]);
    let short =
        TraceRequest { at: Duration::ZERO, input_length: 600, output_length: 1, hash_ids: vec![] };
    assert_eq!(short.prompt(512).len(), 600, "inputs beyond the hash ids are padded");
}

#[test]
fn bad_trace_lines_name_the_file_and_line() {
    let path =
        write_trace(&[r#"{"timestamp": 0, "input_length": 1, "output_length": 1}"#, "{oops"]);
    let spec =
        TraceSpec { path: path.clone(), time_scale: 1.0, max_requests: None, block_tokens: 512 };
    let err = read_trace(&spec).expect_err("line 2 is bad");
    assert!(err.to_string().contains(":2"), "{err}");
    std::fs::remove_file(path).expect("cleanup");
}
