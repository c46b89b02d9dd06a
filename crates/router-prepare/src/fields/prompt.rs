//! A prompt field (`prompt`, `text`, `input_ids`) read straight into what the router uses:
//! strings, or token ids as 32-bit numbers, never a JSON value per item. A list's kind is its
//! first item's; an item of another kind (or a number that is no token id) ends the building,
//! the rest is only walked, and the first problem is kept for validation to name. Memory is
//! the prompt's own: four bytes per token id (at least two bytes of body each) and a string's
//! bytes, a batch's prompts bounded by the batch limit as they are read.

use std::fmt;

use serde::de::{DeserializeSeed, Deserializer, SeqAccess, Visitor};

use super::Walk;

/// A prompt field as read.
#[derive(Debug, PartialEq)]
pub enum PromptField {
    /// `null`.
    Null,
    /// One string.
    Text(String),
    /// A list of strings.
    Texts(Vec<String>),
    /// A list of token ids.
    Ids(Vec<u32>),
    /// A list of lists of token ids.
    IdLists(Vec<Vec<u32>>),
    /// An empty list.
    Empty,
    /// Anything else, with the first problem found and the length of its text.
    Invalid { problem: PromptProblem, text: usize },
}

/// Why a prompt field is none of the accepted shapes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PromptProblem {
    /// Not a string nor a list of strings, of ids or of lists of ids.
    Shape,
    /// A list of ids holds an item that is no non-negative integer below 2^32.
    NotAnId,
    /// The list of ids at this index of a list of lists is empty.
    EmptyList(usize),
    /// A batch of more prompts than the limit: how many, and whether they are lists of ids.
    TooMany { prompts: usize, ids: bool },
}

impl PromptField {
    /// The length of its text: its strings, or what was walked of an invalid one.
    pub fn text_len(&self) -> usize {
        match self {
            PromptField::Text(text) => text.len(),
            PromptField::Texts(texts) => texts.iter().map(String::len).sum(),
            PromptField::Invalid { text, .. } => *text,
            PromptField::Null
            | PromptField::Ids(_)
            | PromptField::IdLists(_)
            | PromptField::Empty => 0,
        }
    }
}

/// Reads a prompt field; a batch may hold at most `max_batch` prompts.
pub(super) struct ReadPrompt {
    pub max_batch: usize,
}

impl<'de> DeserializeSeed<'de> for ReadPrompt {
    type Value = PromptField;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<PromptField, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for ReadPrompt {
    type Value = PromptField;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_unit<E>(self) -> Result<PromptField, E> {
        Ok(PromptField::Null)
    }

    fn visit_bool<E>(self, _: bool) -> Result<PromptField, E> {
        Ok(invalid(PromptProblem::Shape, 0))
    }

    fn visit_i64<E>(self, _: i64) -> Result<PromptField, E> {
        Ok(invalid(PromptProblem::Shape, 0))
    }

    fn visit_u64<E>(self, _: u64) -> Result<PromptField, E> {
        Ok(invalid(PromptProblem::Shape, 0))
    }

    fn visit_f64<E>(self, _: f64) -> Result<PromptField, E> {
        Ok(invalid(PromptProblem::Shape, 0))
    }

    fn visit_str<E>(self, text: &str) -> Result<PromptField, E> {
        Ok(PromptField::Text(text.to_owned()))
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, members: A) -> Result<PromptField, A::Error> {
        Ok(invalid(PromptProblem::Shape, Walk::ANY.visit_map(members)?.text))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut items: A) -> Result<PromptField, A::Error> {
        let mut list = List { max_batch: self.max_batch, ..List::default() };
        while items.next_element_seed(Item(&mut list))?.is_some() {
            list.count += 1;
        }
        Ok(list.finish())
    }
}

fn invalid(problem: PromptProblem, text: usize) -> PromptField {
    PromptField::Invalid { problem, text }
}

/// What a list is, from its first item.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Texts,
    Ids,
    IdLists,
}

/// A list being read.
#[derive(Default)]
struct List {
    kind: Option<Kind>,
    /// Items read so far.
    count: usize,
    texts: Vec<String>,
    ids: Vec<u32>,
    lists: Vec<Vec<u32>>,
    /// The first problem; once set, nothing more is built.
    problem: Option<PromptProblem>,
    /// The text walked after the building ended.
    walked: usize,
    max_batch: usize,
}

impl List {
    /// Notes the first problem and lets go of what was built.
    fn fail(&mut self, problem: PromptProblem) {
        if self.problem.is_none() {
            self.problem = Some(problem);
            self.walked += self.texts.iter().map(String::len).sum::<usize>();
            self.texts = Vec::new();
            self.ids = Vec::new();
            self.lists = Vec::new();
        }
    }

    fn building(&self, kind: Kind) -> bool {
        self.problem.is_none() && self.kind.is_none_or(|k| k == kind)
    }

    /// Whether a batch of `kind` has room for one more prompt, noting the problem if not.
    fn room(&mut self, kind: Kind) -> bool {
        let prompts = if kind == Kind::IdLists { self.lists.len() } else { self.texts.len() };
        let full = prompts == self.max_batch;
        if full {
            self.fail(PromptProblem::TooMany { prompts: 0, ids: kind == Kind::IdLists });
        }
        !full
    }

    fn finish(self) -> PromptField {
        if let Some(problem) = self.problem {
            let problem = match problem {
                PromptProblem::TooMany { ids, .. } => {
                    PromptProblem::TooMany { prompts: self.count, ids }
                }
                problem => problem,
            };
            return invalid(problem, self.walked);
        }
        match self.kind {
            None => PromptField::Empty,
            Some(Kind::Texts) => PromptField::Texts(self.texts),
            Some(Kind::Ids) => PromptField::Ids(self.ids),
            Some(Kind::IdLists) => PromptField::IdLists(self.lists),
        }
    }
}

/// Reads one item of a prompt list into the list.
struct Item<'l>(&'l mut List);

impl<'de> DeserializeSeed<'de> for Item<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl Item<'_> {
    /// A number item: an id of a list of ids, else a problem.
    fn number(self, id: Option<u32>) {
        let list = self.0;
        match (list.kind, id) {
            (None | Some(Kind::Ids), Some(id)) if list.problem.is_none() => {
                list.kind = Some(Kind::Ids);
                list.ids.push(id);
            }
            (None | Some(Kind::Ids), _) => {
                list.kind = Some(Kind::Ids);
                list.fail(PromptProblem::NotAnId);
            }
            _ => list.fail(PromptProblem::Shape),
        }
    }

    /// Any other item that is not a string nor a list.
    fn other(self, text: usize) {
        let list = self.0;
        // In a list of ids it is an id that is none; first or in another list, the wrong shape.
        match list.kind {
            Some(Kind::Ids) => list.fail(PromptProblem::NotAnId),
            _ => list.fail(PromptProblem::Shape),
        }
        list.walked += text;
    }
}

impl<'de> Visitor<'de> for Item<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_unit<E>(self) -> Result<(), E> {
        self.other(0);
        Ok(())
    }

    fn visit_bool<E>(self, _: bool) -> Result<(), E> {
        self.other(0);
        Ok(())
    }

    fn visit_i64<E>(self, id: i64) -> Result<(), E> {
        self.number(u32::try_from(id).ok());
        Ok(())
    }

    fn visit_u64<E>(self, id: u64) -> Result<(), E> {
        self.number(u32::try_from(id).ok());
        Ok(())
    }

    fn visit_f64<E>(self, _: f64) -> Result<(), E> {
        self.number(None);
        Ok(())
    }

    fn visit_str<E>(self, text: &str) -> Result<(), E> {
        let list = self.0;
        if list.building(Kind::Texts) && list.room(Kind::Texts) {
            list.kind = Some(Kind::Texts);
            list.texts.push(text.to_owned());
        } else {
            match list.kind {
                Some(Kind::Ids) => list.fail(PromptProblem::NotAnId),
                _ => list.fail(PromptProblem::Shape),
            }
            list.walked += text.len();
        }
        Ok(())
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, members: A) -> Result<(), A::Error> {
        let text = Walk::ANY.visit_map(members)?.text;
        self.other(text);
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut items: A) -> Result<(), A::Error> {
        let list = self.0;
        if !(list.building(Kind::IdLists) && list.room(Kind::IdLists)) {
            if list.kind == Some(Kind::Ids) {
                list.fail(PromptProblem::NotAnId);
            } else {
                list.fail(PromptProblem::Shape);
            }
            list.walked += Walk::ANY.visit_seq(items)?.text;
            return Ok(());
        }
        list.kind = Some(Kind::IdLists);
        let mut ids = Vec::new();
        while let Some(walked) = items.next_element_seed(Id)? {
            match walked {
                Ok(id) if list.problem.is_none() => ids.push(id),
                Ok(_) => {}
                Err(text) => {
                    list.fail(PromptProblem::NotAnId);
                    list.walked += text;
                }
            }
        }
        if list.problem.is_none() {
            if ids.is_empty() {
                list.fail(PromptProblem::EmptyList(list.count));
            } else {
                list.lists.push(ids);
            }
        }
        Ok(())
    }
}

/// One token id of a list of lists: the id, or the text walked of an item that is none.
struct Id;

impl<'de> DeserializeSeed<'de> for Id {
    type Value = Result<u32, usize>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Id {
    type Value = Result<u32, usize>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_u64<E>(self, id: u64) -> Result<Self::Value, E> {
        Ok(u32::try_from(id).map_err(|_| 0))
    }

    fn visit_i64<E>(self, id: i64) -> Result<Self::Value, E> {
        Ok(u32::try_from(id).map_err(|_| 0))
    }

    fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
        Ok(Err(0))
    }

    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(Err(0))
    }

    fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
        Ok(Err(0))
    }

    fn visit_str<E>(self, text: &str) -> Result<Self::Value, E> {
        Ok(Err(text.len()))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, items: A) -> Result<Self::Value, A::Error> {
        Ok(Err(Walk::ANY.visit_seq(items)?.text))
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, members: A) -> Result<Self::Value, A::Error> {
        Ok(Err(Walk::ANY.visit_map(members)?.text))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(text: &str) -> PromptField {
        let mut deserializer = serde_json::Deserializer::from_str(text);
        ReadPrompt { max_batch: 3 }.deserialize(&mut deserializer).expect("JSON")
    }

    fn invalid(problem: PromptProblem, text: usize) -> PromptField {
        PromptField::Invalid { problem, text }
    }

    #[test]
    fn every_accepted_shape_is_read_into_strings_or_ids() {
        assert_eq!(read("null"), PromptField::Null);
        assert_eq!(read(r#""hi""#), PromptField::Text("hi".into()));
        assert_eq!(read("[]"), PromptField::Empty);
        assert_eq!(
            read(r#"["a","","bc"]"#),
            PromptField::Texts(vec!["a".into(), "".into(), "bc".into()])
        );
        assert_eq!(read("[0, 7, 4294967295]"), PromptField::Ids(vec![0, 7, u32::MAX]));
        assert_eq!(read("[[1,2],[3]]"), PromptField::IdLists(vec![vec![1, 2], vec![3]]));
    }

    #[test]
    fn the_first_problem_is_kept_and_the_text_still_measured() {
        use PromptProblem::{EmptyList, NotAnId, Shape, TooMany};
        let cases = [
            ("5", invalid(Shape, 0)),
            (r#"{"a":"xy"}"#, invalid(Shape, 2)),
            (r#"["ab",1,"c"]"#, invalid(Shape, 3)),
            (r#"[null,"a"]"#, invalid(Shape, 1)),
            (r#"[1,"ab"]"#, invalid(NotAnId, 2)),
            ("[1,-1]", invalid(NotAnId, 0)),
            ("[1,2.5]", invalid(NotAnId, 0)),
            ("[4294967296]", invalid(NotAnId, 0)),
            ("[1,[2]]", invalid(NotAnId, 0)),
            ("[[1],5]", invalid(Shape, 0)),
            (r#"[[1],["ab"]]"#, invalid(NotAnId, 2)),
            ("[[1],[],[-1]]", invalid(EmptyList(1), 0)),
            ("[[1],[-1],[]]", invalid(NotAnId, 0)),
            (r#"["a","b","c","d","e"]"#, invalid(TooMany { prompts: 5, ids: false }, 5)),
            ("[[1],[2],[3],[4]]", invalid(TooMany { prompts: 4, ids: true }, 0)),
        ];
        for (text, expected) in cases {
            assert_eq!(read(text), expected, "{text}");
        }
    }

    #[test]
    fn a_list_of_ids_is_not_a_batch() {
        let ids = format!("[{}]", ["1"; 10].join(","));
        assert_eq!(read(&ids), PromptField::Ids(vec![1; 10]));
    }
}
