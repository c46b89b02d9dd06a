//! A Rust tokenizer just good enough for the module graph: identifiers, `::` and single
//! punctuation characters, each with its line. Comments, string, byte-string, raw-string and
//! character literals, lifetimes and numbers produce no tokens, so a path written in a comment
//! or a string never counts as an import.

/// One token and the 1-based line it starts on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Token {
    pub(crate) kind: Kind,
    pub(crate) line: usize,
}

/// What a token is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// An identifier or keyword (`r#type` becomes `type`).
    Ident(String),
    /// `::`.
    PathSep,
    /// Any other punctuation character.
    Punct(char),
}

impl Token {
    /// The identifier, if this is one.
    pub(crate) fn ident(&self) -> Option<&str> {
        match &self.kind {
            Kind::Ident(name) => Some(name),
            _ => None,
        }
    }

    /// Whether this is the punctuation `c`.
    pub(crate) fn is(&self, c: char) -> bool {
        self.kind == Kind::Punct(c)
    }
}

/// The tokens of `source`.
pub(crate) fn tokens(source: &str) -> Vec<Token> {
    let chars: Vec<char> = source.chars().collect();
    let mut lexer = Lexer { chars: &chars, at: 0, line: 1, out: Vec::new() };
    lexer.run();
    lexer.out
}

struct Lexer<'a> {
    chars: &'a [char],
    at: usize,
    line: usize,
    out: Vec<Token>,
}

impl Lexer<'_> {
    fn peek(&self, ahead: usize) -> Option<char> {
        self.chars.get(self.at + ahead).copied()
    }

    /// Moves past one character, counting lines.
    fn bump(&mut self) {
        if self.peek(0) == Some('\n') {
            self.line += 1;
        }
        self.at += 1;
    }

    fn run(&mut self) {
        while let Some(c) = self.peek(0) {
            let line = self.line;
            match c {
                '/' if self.peek(1) == Some('/') => self.line_comment(),
                '/' if self.peek(1) == Some('*') => self.block_comment(),
                '"' => self.string(),
                '\'' => self.quote(),
                'b' | 'c' if self.peek(1) == Some('"') => {
                    self.bump();
                    self.string();
                }
                'b' if self.peek(1) == Some('\'') => {
                    self.bump();
                    self.quote();
                }
                'r' | 'b' | 'c' if self.raw_string_ahead() => self.raw_string(),
                'r' if self.peek(1) == Some('#') && self.peek(2).is_some_and(is_ident_start) => {
                    self.bump();
                    self.bump();
                    self.ident(line);
                }
                c if is_ident_start(c) => self.ident(line),
                c if c.is_ascii_digit() => {
                    while self.peek(0).is_some_and(is_ident_continue) {
                        self.bump();
                    }
                }
                ':' if self.peek(1) == Some(':') => {
                    self.bump();
                    self.bump();
                    self.out.push(Token { kind: Kind::PathSep, line });
                }
                c if c.is_whitespace() => self.bump(),
                c => {
                    self.bump();
                    self.out.push(Token { kind: Kind::Punct(c), line });
                }
            }
        }
    }

    fn line_comment(&mut self) {
        while self.peek(0).is_some_and(|c| c != '\n') {
            self.bump();
        }
    }

    /// A block comment, nested ones included.
    fn block_comment(&mut self) {
        let mut depth = 0usize;
        while let Some(c) = self.peek(0) {
            if c == '/' && self.peek(1) == Some('*') {
                depth += 1;
                self.bump();
            } else if c == '*' && self.peek(1) == Some('/') {
                depth -= 1;
                self.bump();
                if depth == 0 {
                    self.bump();
                    return;
                }
            }
            self.bump();
        }
    }

    /// A `"..."` literal, at its opening quote.
    fn string(&mut self) {
        self.bump();
        while let Some(c) = self.peek(0) {
            self.bump();
            match c {
                '\\' => self.bump(),
                '"' => return,
                _ => {}
            }
        }
    }

    /// A character literal or a lifetime, at its quote.
    fn quote(&mut self) {
        self.bump();
        if self.peek(0) == Some('\\') {
            while self.peek(0).is_some_and(|c| c != '\'') {
                if self.peek(0) == Some('\\') {
                    self.bump();
                }
                self.bump();
            }
            self.bump();
        } else if self.peek(1) == Some('\'') {
            self.bump();
            self.bump();
        } else {
            // A lifetime or label: its name is not an identifier that matters here.
            while self.peek(0).is_some_and(is_ident_continue) {
                self.bump();
            }
        }
    }

    /// Whether a raw (byte or C) string starts here: `r"`, `r#"`, `br##"` ...
    fn raw_string_ahead(&self) -> bool {
        let mut ahead = usize::from(self.peek(0) != Some('r'));
        if self.peek(ahead) != Some('r') {
            return false;
        }
        ahead += 1;
        while self.peek(ahead) == Some('#') {
            ahead += 1;
        }
        self.peek(ahead) == Some('"')
    }

    fn raw_string(&mut self) {
        while self.peek(0) != Some('r') {
            self.bump();
        }
        self.bump();
        let mut hashes = 0;
        while self.peek(0) == Some('#') {
            hashes += 1;
            self.bump();
        }
        self.bump();
        while let Some(c) = self.peek(0) {
            self.bump();
            if c == '"' && (0..hashes).all(|i| self.peek(i) == Some('#')) {
                for _ in 0..hashes {
                    self.bump();
                }
                return;
            }
        }
    }

    fn ident(&mut self, line: usize) {
        let start = self.at;
        while self.peek(0).is_some_and(is_ident_continue) {
            self.bump();
        }
        let name: String = self.chars[start..self.at].iter().collect();
        self.out.push(Token { kind: Kind::Ident(name), line });
    }
}

fn is_ident_start(c: char) -> bool {
    c == '_' || c.is_alphabetic()
}

fn is_ident_continue(c: char) -> bool {
    c == '_' || c.is_alphanumeric()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn idents(source: &str) -> Vec<String> {
        tokens(source).iter().filter_map(|t| t.ident().map(str::to_owned)).collect()
    }

    #[test]
    fn comments_strings_and_chars_produce_no_tokens() {
        let source = "a // crate::x\n/* crate::y /* nested */ still */ b \"crate::z \\\" q\" \
                      r#\"crate::w \"# c 'x' '\\n' d b\"bytes\" e";
        assert_eq!(idents(source), ["a", "b", "c", "d", "e"]);
    }

    #[test]
    fn lifetimes_raw_identifiers_and_lines() {
        let tokens = tokens("fn f<'a>(x: &'a str)\n-> r#type::T");
        let names: Vec<_> = tokens.iter().filter_map(Token::ident).collect();
        assert_eq!(names, ["fn", "f", "x", "str", "type", "T"]);
        assert_eq!(tokens.iter().find(|t| t.ident() == Some("type")).map(|t| t.line), Some(2));
        assert!(tokens.iter().any(|t| t.kind == Kind::PathSep));
    }
}
