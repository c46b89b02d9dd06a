//! The session workload: generated text, shared system prompts and growing histories.

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
