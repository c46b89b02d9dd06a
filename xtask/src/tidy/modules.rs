//! The module graph of one crate target and its cycles.
//!
//! Modules are found by following `mod` declarations from the target's root file (a `mod` or
//! any other item under `#[cfg(test)]` is left out, with everything in it). An edge `a -> b` is
//! a `crate::`, `super::` or `self::` path written in `a`, in a `use` or in code (or a path
//! through a child or through a module `a` imported under a name: `use crate::engine;` then
//! `engine::load::X`), and goes to the longest prefix of the path that is a module; an item
//! that module only re-exports (`pub use`) leads on to the module it comes from, so that a
//! module using `crate::Error` depends on the module defining `Error`, and a cycle behind a
//! re-export is a cycle. Paths into the module's own parts (`socket::receive` or
//! `self::socket::Target` in `subscribe/mod.rs`) make no edge: a module composing its parts,
//! which use the parent's shared types, is the ordinary shape of a module with parts. What is
//! checked is that parts, and modules that are not parent and part, never lean on each other
//! both ways ([`cycles`]), and that no two top-level modules do, counting the edges of all
//! their modules ([`top_level_cycles`]).
//!
//! Strongly connected components of more than one module (Tarjan) are the cycles.

use std::collections::{BTreeMap, BTreeSet};

use super::lex::{self, Kind, Token};

/// A module, by its path from the crate root (empty for the root).
pub(crate) type ModPath = Vec<String>;

/// A dependency cycle between modules of one target.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Cycle {
    /// The modules in the cycle, sorted.
    pub(crate) modules: Vec<ModPath>,
    /// The edges inside the cycle, each with the places that make it.
    pub(crate) edges: Vec<(ModPath, ModPath, Vec<Evidence>)>,
}

/// Where an edge comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Evidence {
    pub(crate) file: String,
    pub(crate) line: usize,
    /// The source line, trimmed.
    pub(crate) text: String,
}

/// A module as parsed.
#[derive(Debug, Default)]
struct Module {
    file: String,
    children: BTreeSet<String>,
    /// The paths of its `use` declarations.
    imports: Vec<Import>,
    /// Other paths written in code.
    paths: Vec<(Vec<String>, usize)>,
}

/// The cycles among the modules of the target whose root is `root`, reading files from `files`
/// (relative path to text; a declared module whose file is absent is skipped).
pub(crate) fn cycles(files: &BTreeMap<String, String>, root: &str) -> Vec<Cycle> {
    let mut modules = BTreeMap::new();
    let dir = parent_dir(root);
    parse_file(files, root, Vec::new(), &dir, &mut modules);
    let graph = edges(&modules, files);
    cycles_of(&graph)
}

/// The cycles between the top-level modules of the target whose root is `root`: every edge
/// between two modules (re-exports included: a module that re-exports another's item depends
/// on it) counts between the top-level modules it joins. `config::file -> limit` and
/// `limit -> config` make `config` and `limit` a cycle, though no two modules lean on each
/// other both ways. The crate root is left out: it declares and re-exports every module, and
/// modules use the names it offers.
pub(crate) fn top_level_cycles(files: &BTreeMap<String, String>, root: &str) -> Vec<Cycle> {
    let mut modules = BTreeMap::new();
    let dir = parent_dir(root);
    parse_file(files, root, Vec::new(), &dir, &mut modules);
    let mut graph = Graph::new();
    for (from, tos) in edges(&modules, files) {
        let Some(top_from) = from.first() else { continue };
        for (to, places) in tos {
            let Some(top_to) = to.first() else { continue };
            if top_from == top_to {
                continue;
            }
            let (a, b) = (vec![top_from.clone()], vec![top_to.clone()]);
            let entry = graph.entry(a).or_default().entry(b).or_default();
            for place in places {
                if !entry.contains(&place) {
                    entry.push(place);
                }
            }
        }
    }
    cycles_of(&graph)
}

/// The cycles of `graph`: its strongly connected components of more than one module, each
/// with the edges inside it.
fn cycles_of(graph: &Graph) -> Vec<Cycle> {
    strongly_connected(graph)
        .into_iter()
        .map(|scc| {
            let inside: BTreeSet<&ModPath> = scc.iter().collect();
            let edges = graph
                .iter()
                .flat_map(|(from, tos)| tos.iter().map(move |(to, ev)| (from, to, ev)))
                .filter(|(from, to, _)| inside.contains(from) && inside.contains(to))
                .map(|(from, to, ev)| (from.clone(), to.clone(), ev.clone()))
                .collect();
            let mut modules = scc;
            modules.sort();
            Cycle { modules, edges }
        })
        .collect()
}

/// `crate` for the root, else `a::b`.
pub(crate) fn display(path: &[String]) -> String {
    if path.is_empty() { "crate".to_owned() } else { path.join("::") }
}

fn parent_dir(file: &str) -> String {
    file.rfind('/').map_or_else(String::new, |i| file[..=i].to_owned())
}

/// Parses `file` as module `path` whose children live in `dir`, then its declared children.
fn parse_file(
    files: &BTreeMap<String, String>,
    file: &str,
    path: ModPath,
    dir: &str,
    modules: &mut BTreeMap<ModPath, Module>,
) {
    let Some(source) = files.get(file) else { return };
    let tokens = lex::tokens(source);
    let mut parser = Parser { tokens: &tokens, at: 0, file, declared: Vec::new() };
    parser.module(path, dir.to_owned(), modules, false);
    for (child, child_dir) in std::mem::take(&mut parser.declared) {
        let name = child.last().cloned().unwrap_or_default();
        let flat = format!("{child_dir}{name}.rs");
        let file =
            if files.contains_key(&flat) { flat } else { format!("{child_dir}{name}/mod.rs") };
        parse_file(files, &file, child, &format!("{child_dir}{name}/"), modules);
    }
}

struct Parser<'a> {
    tokens: &'a [Token],
    at: usize,
    file: &'a str,
    /// File modules declared so far (`mod x;`), with the directory their file is in.
    declared: Vec<(ModPath, String)>,
}

impl Parser<'_> {
    fn ident(&self, ahead: usize) -> Option<&str> {
        self.tokens.get(self.at + ahead).and_then(Token::ident)
    }

    fn is(&self, ahead: usize, c: char) -> bool {
        self.tokens.get(self.at + ahead).is_some_and(|t| t.is(c))
    }

    fn line(&self) -> usize {
        self.tokens.get(self.at).map_or(0, |t| t.line)
    }

    /// Parses a module body up to its closing brace (or the end of the file), registering it
    /// under `path` unless `test_only`.
    fn module(
        &mut self,
        path: ModPath,
        dir: String,
        modules: &mut BTreeMap<ModPath, Module>,
        test_only: bool,
    ) {
        let mut module = Module { file: self.file.to_owned(), ..Module::default() };
        let mut depth = 0usize;
        let mut cfg_test = false;
        while let Some(token) = self.tokens.get(self.at) {
            if token.is('#') && (self.is(1, '[') || (self.is(1, '!') && self.is(2, '['))) {
                let inner = self.is(1, '!');
                cfg_test |= self.attribute() && !inner;
                continue;
            }
            if cfg_test {
                cfg_test = false;
                self.skip_item(modules, &dir);
                continue;
            }
            match &token.kind {
                Kind::Punct('{') => depth += 1,
                Kind::Punct('}') if depth == 0 => {
                    self.at += 1;
                    break;
                }
                Kind::Punct('}') => depth -= 1,
                Kind::Ident(word) if word == "mod" && self.ident(1).is_some() => {
                    let name = self.ident(1).unwrap_or_default().to_owned();
                    let mut child = path.clone();
                    child.push(name.clone());
                    module.children.insert(name.clone());
                    if self.is(2, '{') {
                        self.at += 3;
                        self.module(child, format!("{dir}{name}/"), modules, test_only);
                    } else {
                        self.at += 2;
                        if !test_only {
                            self.declared.push((child, dir.clone()));
                        }
                    }
                    continue;
                }
                Kind::Ident(word) if word == "use" && !self.is(1, '<') => {
                    let reexport = self.after_visibility();
                    let end = self.statement_end();
                    for (name, path, line) in use_tree(&self.tokens[self.at + 1..end]) {
                        module.imports.push(Import { name, path, line, reexport });
                    }
                    self.at = end;
                    continue;
                }
                Kind::Ident(_) if self.path_starts_here() => {
                    let line = self.line();
                    let segments = self.path_segments();
                    module.paths.push((segments, line));
                    continue;
                }
                _ => {}
            }
            self.at += 1;
        }
        if !test_only {
            modules.insert(path, module);
        }
    }

    /// Consumes an attribute; true when it is `cfg(test)` (or a `cfg` that needs `test`).
    fn attribute(&mut self) -> bool {
        let start = self.at;
        while !self.is(0, '[') {
            self.at += 1;
        }
        let mut depth = 0usize;
        while let Some(token) = self.tokens.get(self.at) {
            self.at += 1;
            if token.is('[') {
                depth += 1;
            } else if token.is(']') {
                depth -= 1;
                if depth == 0 {
                    break;
                }
            }
        }
        let words: Vec<&str> =
            self.tokens[start..self.at].iter().filter_map(Token::ident).collect();
        words.first() == Some(&"cfg") && words.contains(&"test") && !words.contains(&"not")
    }

    /// Skips one item (a `cfg(test)` one): up to its `;`, or through its first brace block.
    /// A test-only inline module is parsed for its own `mod` declarations and then dropped.
    fn skip_item(&mut self, modules: &mut BTreeMap<ModPath, Module>, dir: &str) {
        while let Some(token) = self.tokens.get(self.at) {
            if token.is(';') {
                self.at += 1;
                return;
            }
            if token.is('{') {
                self.at += 1;
                self.module(Vec::new(), dir.to_owned(), modules, true);
                return;
            }
            self.at += 1;
        }
    }

    /// Whether the token here follows `pub` or `pub(...)`.
    fn after_visibility(&self) -> bool {
        let before = |n: usize| self.at.checked_sub(n).and_then(|i| self.tokens.get(i));
        if before(1).and_then(Token::ident) == Some("pub") {
            return true;
        }
        if !before(1).is_some_and(|t| t.is(')')) {
            return false;
        }
        let open = (2..=self.at).find(|&n| before(n).is_some_and(|t| t.is('(')));
        open.is_some_and(|n| before(n + 1).and_then(Token::ident) == Some("pub"))
    }

    /// The index of the `;` that ends the statement starting here.
    fn statement_end(&self) -> usize {
        let mut at = self.at;
        while self.tokens.get(at).is_some_and(|t| !t.is(';')) {
            at += 1;
        }
        at
    }

    /// Whether a path `ident::ident` starts here (and is not the tail of a longer one, nor a
    /// macro's `$crate`).
    fn path_starts_here(&self) -> bool {
        let before = self.at.checked_sub(1).and_then(|i| self.tokens.get(i));
        let continues = before.is_some_and(|t| t.kind == Kind::PathSep || t.is('$'));
        !continues
            && self.tokens.get(self.at + 1).is_some_and(|t| t.kind == Kind::PathSep)
            && self.ident(2).is_some()
    }

    fn path_segments(&mut self) -> Vec<String> {
        let mut segments = Vec::new();
        while let Some(name) = self.ident(0) {
            segments.push(name.to_owned());
            self.at += 1;
            if self.tokens.get(self.at).is_some_and(|t| t.kind == Kind::PathSep)
                && self.ident(1).is_some()
            {
                self.at += 1;
            } else {
                break;
            }
        }
        segments
    }
}

/// One path of a `use` declaration.
#[derive(Debug)]
struct Import {
    /// The name it brings in (`None` for a glob).
    name: Option<String>,
    path: Vec<String>,
    /// The line of its last segment.
    line: usize,
    /// Under `pub` or `pub(...)`: a re-export forwards a name, and a path that reaches the name
    /// through this module leads on to the module it comes from.
    reexport: bool,
}

/// A path of a use tree: the name it brings in, the path, the line of its last segment.
type UsePath = (Option<String>, Vec<String>, usize);

/// The paths of a use tree (the tokens between `use` and `;`). `a::{self, b::C as D}` gives `a`
/// as `a`, and `a::b::C` as `D`.
fn use_tree(tokens: &[Token]) -> Vec<UsePath> {
    let mut out = Vec::new();
    let mut at = usize::from(tokens.first().is_some_and(|t| t.kind == Kind::PathSep));
    if at == 1 {
        return out; // `use ::name`: an external crate
    }
    // Visibility and the like before the tree do not occur: `use` is where the tree starts.
    tree(tokens, &mut at, &mut Vec::new(), &mut out);
    out
}

fn tree(tokens: &[Token], at: &mut usize, prefix: &mut Vec<String>, out: &mut Vec<UsePath>) {
    let depth = prefix.len();
    loop {
        match tokens.get(*at).map(|t| &t.kind) {
            Some(Kind::Ident(name)) if name == "self" && depth > 0 => {
                let line = tokens[*at].line;
                *at += 1;
                let alias = alias(tokens, at).or_else(|| prefix.last().cloned());
                out.push((alias, prefix.clone(), line));
                break;
            }
            Some(Kind::Ident(name)) if name != "as" => {
                let line = tokens[*at].line;
                prefix.push(name.clone());
                *at += 1;
                if tokens.get(*at).is_some_and(|t| t.kind == Kind::PathSep) {
                    *at += 1;
                    continue;
                }
                let alias = alias(tokens, at).or_else(|| prefix.last().cloned());
                out.push((alias, prefix.clone(), line));
                break;
            }
            Some(Kind::Punct('*')) => {
                out.push((None, prefix.clone(), tokens[*at].line));
                *at += 1;
                break;
            }
            Some(Kind::Punct('{')) => {
                *at += 1;
                while tokens.get(*at).is_some_and(|t| !t.is('}')) {
                    let mut inner = prefix.clone();
                    tree(tokens, at, &mut inner, out);
                    if tokens.get(*at).is_some_and(|t| t.is(',')) {
                        *at += 1;
                    }
                }
                *at += 1;
                break;
            }
            _ => break,
        }
    }
    prefix.truncate(depth);
}

/// `as NAME` after a use path, if present (`as _` brings no name in).
fn alias(tokens: &[Token], at: &mut usize) -> Option<String> {
    if tokens.get(*at).and_then(Token::ident) != Some("as") {
        return None;
    }
    let name = tokens.get(*at + 1).and_then(Token::ident).map(str::to_owned);
    *at += 2;
    name.filter(|n| n != "_").or(Some(String::new()))
}

type Graph = BTreeMap<ModPath, BTreeMap<ModPath, Vec<Evidence>>>;

/// Every edge between two different modules, with the lines that make it (a re-export, too:
/// the re-exporting module depends on the module it forwards from).
fn edges(modules: &BTreeMap<ModPath, Module>, files: &BTreeMap<String, String>) -> Graph {
    let mut graph = Graph::new();
    for (from, module) in modules {
        let paths = module
            .imports
            .iter()
            .map(|import| (&import.path, import.line))
            .chain(module.paths.iter().map(|(path, line)| (path, *line)));
        for (path, line) in paths {
            let Some(target) = resolve(modules, from, path, 0) else { continue };
            if target.starts_with(from) {
                continue; // itself or one of its own parts
            }
            let text = files
                .get(&module.file)
                .and_then(|s| s.lines().nth(line.saturating_sub(1)))
                .unwrap_or_default()
                .trim()
                .to_owned();
            let evidence = Evidence { file: module.file.clone(), line, text };
            let places = graph.entry(from.clone()).or_default().entry(target).or_default();
            if !places.contains(&evidence) {
                places.push(evidence);
            }
        }
    }
    graph
}

/// Module aliases followed before giving up (`use a as b; use b as a;` would not end).
const MAX_HOPS: usize = 8;

/// The module that `path`, written in module `from`, names: the longest prefix of the path
/// that is a module of the crate. `None` when the path leads outside the crate, or starts with
/// an imported item rather than a module (the `use` that imported it is the edge).
fn resolve(
    modules: &BTreeMap<ModPath, Module>,
    from: &ModPath,
    path: &[String],
    hops: usize,
) -> Option<ModPath> {
    let module = modules.get(from)?;
    let first = path.first()?;
    let (mut at, rest) = match first.as_str() {
        "crate" => (Vec::new(), &path[1..]),
        "self" => (from.clone(), &path[1..]),
        "super" => (from.clone(), path),
        name if module.children.contains(name) => (from.clone(), path),
        name if hops < MAX_HOPS => {
            let import = module
                .imports
                .iter()
                .find(|i| i.name.as_deref() == Some(name) && i.path.as_slice() != path)?;
            let target = resolve(modules, from, &import.path, hops + 1)?;
            // Only a module alias continues; an imported item's own `use` is the edge.
            let named = import.path.last().map(String::as_str);
            if !is_module(modules, &target, named) {
                return None;
            }
            (target, &path[1..])
        }
        _ => return None,
    };
    let mut consumed = 0;
    for segment in rest {
        match segment.as_str() {
            "super" => {
                at.pop();
            }
            "self" => {}
            name if modules.get(&at).is_some_and(|m| m.children.contains(name)) => {
                at.push(name.to_owned());
            }
            _ => break,
        }
        consumed += 1;
    }
    // An item the module only re-exports is the module it comes from: a cycle behind a
    // `pub use` is a cycle.
    if let Some(item) = rest.get(consumed)
        && hops < MAX_HOPS
        && let Some(import) = modules.get(&at).and_then(|m| {
            m.imports.iter().find(|i| i.reexport && i.name.as_deref() == Some(item.as_str()))
        })
        && let Some(source) = resolve(modules, &at, &import.path, hops + 1)
    {
        return Some(source);
    }
    Some(at)
}

/// Whether `target`, reached through a path ending in `named`, is that module itself.
fn is_module(modules: &BTreeMap<ModPath, Module>, target: &ModPath, named: Option<&str>) -> bool {
    modules.contains_key(target)
        && match named {
            Some("crate" | "self" | "super") | None => true,
            Some(name) => target.last().map(String::as_str) == Some(name),
        }
}

/// Tarjan's strongly connected components with more than one member.
fn strongly_connected(graph: &Graph) -> Vec<Vec<ModPath>> {
    struct State<'g> {
        graph: &'g Graph,
        index: BTreeMap<&'g ModPath, usize>,
        low: BTreeMap<&'g ModPath, usize>,
        stack: Vec<&'g ModPath>,
        on_stack: BTreeSet<&'g ModPath>,
        out: Vec<Vec<ModPath>>,
    }
    fn visit<'g>(state: &mut State<'g>, node: &'g ModPath) {
        let n = state.index.len();
        state.index.insert(node, n);
        state.low.insert(node, n);
        state.stack.push(node);
        state.on_stack.insert(node);
        for next in state.graph.get(node).into_iter().flat_map(BTreeMap::keys) {
            if !state.index.contains_key(next) {
                visit(state, next);
                let low = state.low[next].min(state.low[node]);
                state.low.insert(node, low);
            } else if state.on_stack.contains(next) {
                let low = state.index[next].min(state.low[node]);
                state.low.insert(node, low);
            }
        }
        if state.low[node] == state.index[node] {
            let mut component = Vec::new();
            while let Some(member) = state.stack.pop() {
                state.on_stack.remove(member);
                component.push(member.clone());
                if member == node {
                    break;
                }
            }
            if component.len() > 1 {
                state.out.push(component);
            }
        }
    }
    let mut state = State {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        out: Vec::new(),
    };
    for node in graph.keys() {
        if !state.index.contains_key(node) {
            visit(&mut state, node);
        }
    }
    state.out
}
