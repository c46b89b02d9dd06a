//! What the generator sends in a session workload: multi-turn chat sessions over shared system
//! prompts, with deterministic text (one token per byte with the simulator's byte-level
//! tokenizer). Trace replays are in [`super::trace`].

const WORDS: [&str; 24] = [
    "alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet",
    "kilo", "lima", "mike", "november", "oscar", "papa", "quebec", "romeo", "sierra", "tango",
    "uniform", "victor", "whiskey", "xray",
];

/// SplitMix64, the generator behind every text (and arrival) draw.
#[derive(Clone, Debug)]
pub(crate) struct SplitMix(pub(crate) u64);

impl SplitMix {
    pub(crate) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub(crate) fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Mixes the parts of a text's identity into one seed.
pub(crate) fn seed_of(parts: &[u64]) -> u64 {
    let mut rng = SplitMix(0x6c6f_6164);
    for part in parts {
        rng.0 ^= *part;
        rng.next();
    }
    rng.next()
}

/// Exactly `len` bytes of ASCII words, determined by `seed`.
pub(crate) fn text(seed: u64, len: usize) -> String {
    let mut rng = SplitMix(seed);
    let mut out = String::with_capacity(len + 10);
    while out.len() < len {
        if !out.is_empty() {
            out.push(' ');
        }
        out.push_str(WORDS[(rng.next() % WORDS.len() as u64) as usize]);
    }
    out.truncate(len);
    out
}

/// One chat message as sent.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub(crate) struct Message {
    pub(crate) role: &'static str,
    pub(crate) content: String,
}

/// The shape of a session workload.
#[derive(Clone, Debug, PartialEq)]
pub struct SessionSpec {
    /// Number of sessions (`--sessions`, default 8).
    pub sessions: usize,
    /// Turns per session (`--turns`, default 4).
    pub turns: usize,
    /// Distinct system prompts; session `i` uses prompt `i % system_prompts`
    /// (`--system-prompts`, default 2).
    pub system_prompts: usize,
    /// System prompt length in tokens (bytes) (`--system-prompt-tokens`, default 512).
    pub system_prompt_tokens: usize,
    /// Length of each user turn in tokens (bytes) (`--turn-tokens`, default 64).
    pub turn_tokens: usize,
    /// `max_tokens` of each request (`--output-tokens`, default 16).
    pub output_tokens: usize,
    /// Seed of every text (`--seed`, default 0).
    pub seed: u64,
}

impl Default for SessionSpec {
    fn default() -> Self {
        Self {
            sessions: 8,
            turns: 4,
            system_prompts: 2,
            system_prompt_tokens: 512,
            turn_tokens: 64,
            output_tokens: 16,
            seed: 0,
        }
    }
}

/// A conversation in progress.
#[derive(Clone, Debug)]
pub(crate) struct Session {
    pub(crate) id: usize,
    pub(crate) name: String,
    system: String,
    history: Vec<Message>,
    pub(crate) turn: usize,
    turns: usize,
    turn_tokens: usize,
    seed: u64,
}

impl Session {
    /// The sessions of a spec, in order.
    pub(crate) fn all(spec: &SessionSpec) -> Vec<Session> {
        let prompts: Vec<String> = (0..spec.system_prompts.max(1))
            .map(|i| text(seed_of(&[spec.seed, 1, i as u64]), spec.system_prompt_tokens))
            .collect();
        (0..spec.sessions)
            .map(|id| Session {
                id,
                name: format!("session-{}-{id}", spec.seed),
                system: prompts[id % prompts.len()].clone(),
                history: Vec::new(),
                turn: 0,
                turns: spec.turns,
                turn_tokens: spec.turn_tokens,
                seed: spec.seed,
            })
            .collect()
    }

    pub(crate) fn finished(&self) -> bool {
        self.turn >= self.turns
    }

    /// The messages of the next turn and its user message.
    pub(crate) fn next_turn(&self) -> (Vec<Message>, Message) {
        let user = Message {
            role: "user",
            content: text(
                seed_of(&[self.seed, 2, self.id as u64, self.turn as u64]),
                self.turn_tokens,
            ),
        };
        let mut messages = Vec::with_capacity(self.history.len() + 2);
        if !self.system.is_empty() {
            messages.push(Message { role: "system", content: self.system.clone() });
        }
        messages.extend(self.history.iter().cloned());
        messages.push(user.clone());
        (messages, user)
    }

    /// Records a turn: an answered one extends the history, a failed one is dropped.
    pub(crate) fn record(&mut self, user: Message, answer: Option<String>) {
        if let Some(content) = answer {
            self.history.push(user);
            self.history.push(Message { role: "assistant", content });
        }
        self.turn += 1;
    }
}

#[cfg(test)]
mod tests;
