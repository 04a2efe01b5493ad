//! `wasm-abi order FILE OUT LIST`: the module with the functions named in LIST moved to the
//! front of the code section, in LIST's order, every other function after them in its own
//! order. The engine compiles functions in code-section order, so the request path's
//! functions, scattered by the linker over 900 KB, land on a few adjacent pages.
//!
//! Why: a worker idle between requests meets the plugin's code cold, and what a request
//! costs follows the code pages it touches as well as the lines (docs/plugin-cpu.md "Code
//! pages"). wasm-ld has no symbol-ordering option, so the order is applied after linking.
//!
//! Moving a function renumbers it, so every reference is rewritten through
//! `wasm_encoder::reencode`: calls, `ref.func`, element segments (the table slots behind
//! `call_indirect`, whose slot numbers — what Rust stores as a function pointer — stay as
//! they are), exports, the start function and the name section. Nothing else changes.
//!
//! LIST: one function per line, as `rustc-demangle` prints its name-section name
//! (`ailb_core::balancer::Balancer::on_request_headers::h9a1c…`); blank lines and `#` comments
//! are skipped. A line names the function with exactly that name; when none has it (the hash
//! differs in another build — the Envoy build's features change it — or after a toolchain
//! change), every function with that name less its `::h<hash>` moves (a generic's instances
//! share one). Lines that name nothing are reported, not fatal: the list follows the code,
//! and a stale line only loses its function's place.

use std::collections::HashMap;
use wasm_encoder::reencode::{utils, Error, Reencode};
use wasmparser::{KnownCustom, Name, Parser, Payload, TypeRef};

/// What an order did, for the build log.
#[derive(Debug, PartialEq, Eq)]
pub struct Ordered {
    pub module: Vec<u8>,
    /// Functions moved to the front.
    pub moved: usize,
    /// LIST lines that named no function.
    pub unmatched: Vec<String>,
}

/// The name LIST gives a function: demangled, with the hash of a legacy-mangled name.
pub fn list_name(raw: &str) -> String {
    rustc_demangle::demangle(raw).to_string()
}

/// `name` without the legacy mangling's trailing `::h<16 hex digits>`.
fn without_hash(name: &str) -> &str {
    match name.rsplit_once("::h") {
        Some((short, hash)) if hash.len() == 16 && hash.bytes().all(|b| b.is_ascii_hexdigit()) => {
            short
        }
        _ => name,
    }
}

/// The names of LIST's lines.
pub fn parse_list(text: &str) -> Vec<String> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(str::to_string)
        .collect()
}

/// Imported functions, defined functions and each function's name (`list_name`), by index.
pub struct Layout {
    pub imports: u32,
    pub defined: u32,
    pub names: HashMap<u32, String>,
}

pub fn layout(wasm: &[u8]) -> Result<Layout, String> {
    let mut l = Layout {
        imports: 0,
        defined: 0,
        names: HashMap::new(),
    };
    for payload in Parser::new(0).parse_all(wasm) {
        match payload.map_err(|e| e.to_string())? {
            Payload::ImportSection(s) => {
                for import in s.into_imports() {
                    if matches!(import.map_err(|e| e.to_string())?.ty, TypeRef::Func(_)) {
                        l.imports += 1;
                    }
                }
            }
            Payload::FunctionSection(s) => l.defined = s.count(),
            Payload::CustomSection(c) => {
                if let KnownCustom::Name(names) = c.as_known() {
                    for sub in names {
                        if let Name::Function(map) = sub.map_err(|e| e.to_string())? {
                            for n in map {
                                let n = n.map_err(|e| e.to_string())?;
                                l.names.insert(n.index, list_name(n.name));
                            }
                        }
                    }
                }
            }
            _ => {}
        }
    }
    Ok(l)
}

/// Renumbers defined functions: `order[new] = old`, both counted from the first defined one.
struct Renumber {
    imports: u32,
    order: Vec<u32>,
    new_of: Vec<u32>,
}

impl Reencode for Renumber {
    type Error = String;

    fn function_index(&mut self, func: u32) -> Result<u32, Error<String>> {
        if func < self.imports {
            return Ok(func);
        }
        let at = usize::try_from(func - self.imports).unwrap_or(usize::MAX);
        match self.new_of.get(at) {
            Some(new) => Ok(self.imports + new),
            None => Err(Error::UserError(format!("function {func} does not exist"))),
        }
    }

    fn parse_function_section(
        &mut self,
        functions: &mut wasm_encoder::FunctionSection,
        section: wasmparser::FunctionSectionReader<'_>,
    ) -> Result<(), Error<String>> {
        let types: Vec<u32> = section.into_iter().collect::<Result<_, _>>()?;
        for old in self.order.clone() {
            let Some(&ty) = types.get(old as usize) else {
                return Err(Error::UserError(format!("function {old} has no type")));
            };
            functions.function(self.type_index(ty)?);
        }
        Ok(())
    }

    fn parse_code_section(
        &mut self,
        code: &mut wasm_encoder::CodeSection,
        section: wasmparser::CodeSectionReader<'_>,
    ) -> Result<(), Error<String>> {
        let bodies: Vec<wasmparser::FunctionBody> =
            section.into_iter().collect::<Result<_, _>>()?;
        if bodies.len() != self.order.len() {
            return Err(Error::UserError("code and function sections differ".into()));
        }
        for old in self.order.clone() {
            if let Some(body) = bodies.get(old as usize) {
                utils::parse_function_body(self, code, body.clone())?;
            }
        }
        Ok(())
    }

    fn custom_name_section(
        &mut self,
        section: wasmparser::NameSectionReader<'_>,
    ) -> Result<wasm_encoder::NameSection, Error<String>> {
        function_names(self, section, |_| false)
    }
}

/// The name section of a rewrite: the module's name and the function names through
/// `r.function_index`, in index order as the format asks, less those `gone` says were
/// removed. The other name maps (locals, labels, types...) are not kept: a stripped build has
/// none worth keeping.
pub fn function_names<R: Reencode<Error = String>>(
    r: &mut R,
    section: wasmparser::NameSectionReader<'_>,
    gone: impl Fn(u32) -> bool,
) -> Result<wasm_encoder::NameSection, Error<String>> {
    let mut out = wasm_encoder::NameSection::new();
    for sub in section {
        match sub? {
            Name::Module { name, .. } => out.module(name),
            Name::Function(map) => {
                let mut names = Vec::new();
                for n in map {
                    let n = n?;
                    if !gone(n.index) {
                        names.push((r.function_index(n.index)?, n.name));
                    }
                }
                names.sort_unstable();
                let mut map = wasm_encoder::NameMap::new();
                for (index, name) in names {
                    map.append(index, name);
                }
                out.functions(&map);
            }
            _ => {}
        }
    }
    Ok(out)
}

/// Where each defined function goes: `order[new] = old` (counted from the first defined
/// one, after `imports` imported ones), the first `moved` of them listed, and the lines
/// that named nothing.
pub struct Plan {
    imports: u32,
    order: Vec<u32>,
    pub moved: usize,
    pub unmatched: Vec<String>,
}

/// The order `list` gives `wasm`'s functions, without writing a module.
pub fn plan(wasm: &[u8], list: &[String]) -> Result<Plan, String> {
    let l = layout(wasm)?;
    // Defined functions (counted from the first) by name, and by name less its hash.
    let mut by_name: HashMap<&str, Vec<u32>> = HashMap::new();
    let mut by_short: HashMap<&str, Vec<u32>> = HashMap::new();
    let mut indices: Vec<(&u32, &String)> = l.names.iter().collect();
    indices.sort_unstable();
    for (&index, name) in indices {
        if index >= l.imports {
            by_name.entry(name).or_default().push(index - l.imports);
            by_short
                .entry(without_hash(name))
                .or_default()
                .push(index - l.imports);
        }
    }
    let defined = usize::try_from(l.defined).map_err(|e| e.to_string())?;
    let mut taken = vec![false; defined];
    let mut order = Vec::with_capacity(defined);
    let mut unmatched = Vec::new();
    for name in list {
        let found = by_name
            .get(name.as_str())
            .or_else(|| by_short.get(without_hash(name)));
        let Some(found) = found else {
            unmatched.push(name.clone());
            continue;
        };
        for &at in found {
            if let Some(t) = taken.get_mut(at as usize).filter(|t| !**t) {
                *t = true;
                order.push(at);
            }
        }
    }
    let moved = order.len();
    order.extend((0..l.defined).filter(|&at| !taken.get(at as usize).copied().unwrap_or(true)));
    Ok(Plan {
        imports: l.imports,
        order,
        moved,
        unmatched,
    })
}

/// `wasm` written back through `reencoder` (this module's and src/trace.rs's rewrites).
pub fn rewrite<R: Reencode<Error = String>>(
    reencoder: &mut R,
    wasm: &[u8],
) -> Result<Vec<u8>, String> {
    let mut module = wasm_encoder::Module::new();
    reencoder
        .parse_core_module(&mut module, Parser::new(0), wasm)
        .map_err(|e| match e {
            Error::UserError(e) => e,
            other => other.to_string(),
        })?;
    Ok(module.finish())
}

/// `wasm` with the functions named in `list` first (module doc).
pub fn order(wasm: &[u8], list: &[String]) -> Result<Ordered, String> {
    let Plan {
        imports,
        order,
        moved,
        unmatched,
    } = plan(wasm, list)?;
    let defined = order.len();
    let mut new_of = vec![0u32; defined];
    for (new, &old) in order.iter().enumerate() {
        if let Some(slot) = new_of.get_mut(old as usize) {
            *slot = u32::try_from(new).map_err(|e| e.to_string())?;
        }
    }
    let mut renumber = Renumber {
        imports,
        order,
        new_of,
    };
    Ok(Ordered {
        module: rewrite(&mut renumber, wasm)?,
        moved,
        unmatched,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use wasm_encoder::{
        CodeSection, ConstExpr, ElementSection, Elements, ExportKind, ExportSection, Function,
        FunctionSection, ImportSection, Instruction, Module, NameMap, NameSection, RefType,
        TableSection, TableType, TypeSection, ValType,
    };

    fn module() -> Vec<u8> {
        renamed(&["log", "a", "b", "c"])
    }

    /// One import, then defined functions `a` (calls `c`), `b` (calls `a` through the table),
    /// `c` (returns 7), named `names` (the import first); `c` is exported, the table holds `a`
    /// in slot 0.
    fn renamed(names: &[&str; 4]) -> Vec<u8> {
        let mut m = Module::new();
        let mut types = TypeSection::new();
        types.ty().function([], [ValType::I32]);
        types.ty().function([ValType::I32], []);
        m.section(&types);
        let mut imports = ImportSection::new();
        imports.import("env", "log", wasm_encoder::EntityType::Function(1));
        m.section(&imports);
        let mut funcs = FunctionSection::new();
        for _ in 0..3 {
            funcs.function(0);
        }
        m.section(&funcs);
        let mut tables = TableSection::new();
        tables.table(TableType {
            element_type: RefType::FUNCREF,
            minimum: 1,
            maximum: Some(1),
            table64: false,
            shared: false,
        });
        m.section(&tables);
        let mut exports = ExportSection::new();
        exports.export("answer", ExportKind::Func, 3);
        m.section(&exports);
        let mut elements = ElementSection::new();
        elements.active(
            Some(0),
            &ConstExpr::i32_const(0),
            Elements::Functions(std::borrow::Cow::Borrowed(&[1])),
        );
        m.section(&elements);
        let mut code = CodeSection::new();
        let body = |ins: &[Instruction]| {
            let mut f = Function::new([]);
            for i in ins {
                f.instruction(i);
            }
            f.instruction(&Instruction::End);
            f
        };
        code.function(&body(&[Instruction::Call(3)]));
        code.function(&body(&[
            Instruction::I32Const(0),
            Instruction::CallIndirect {
                type_index: 0,
                table_index: 0,
            },
        ]));
        code.function(&body(&[Instruction::I32Const(7)]));
        m.section(&code);
        let mut section = NameSection::new();
        let mut map = NameMap::new();
        for (i, n) in names.iter().enumerate() {
            map.append(i as u32, n);
        }
        section.functions(&map);
        m.section(&section);
        m.finish()
    }

    /// (index → name, the names each function's body calls, exported name → function name,
    /// table slot 0's function name)
    fn read(wasm: &[u8]) -> (Vec<String>, Vec<Vec<String>>, String, String) {
        wasmparser::Validator::new().validate_all(wasm).unwrap();
        let l = layout(wasm).unwrap();
        let name = |i: u32| l.names[&i].clone();
        let (mut calls, mut export, mut slot0) = (Vec::new(), String::new(), String::new());
        for p in Parser::new(0).parse_all(wasm) {
            match p.unwrap() {
                Payload::CodeSectionEntry(body) => {
                    let mut called = Vec::new();
                    for op in body.get_operators_reader().unwrap() {
                        match op.unwrap() {
                            wasmparser::Operator::Call { function_index } => {
                                called.push(name(function_index))
                            }
                            wasmparser::Operator::CallIndirect { .. } => {
                                called.push("table".into())
                            }
                            _ => {}
                        }
                    }
                    calls.push(called);
                }
                Payload::ExportSection(s) => {
                    let e = s.into_iter().next().unwrap().unwrap();
                    export = format!("{} -> {}", e.name, name(e.index));
                }
                Payload::ElementSection(s) => {
                    let e = s.into_iter().next().unwrap().unwrap();
                    if let wasmparser::ElementItems::Functions(f) = e.items {
                        slot0 = name(f.into_iter().next().unwrap().unwrap());
                    }
                }
                _ => {}
            }
        }
        let order = (l.imports..l.imports + l.defined).map(name).collect();
        (order, calls, export, slot0)
    }

    #[test]
    fn listed_functions_move_first_and_every_reference_follows() {
        let before = module();
        let list = parse_list("# hot\nc\n\nb\nnot_there\n");
        let out = order(&before, &list).unwrap();
        assert_eq!(
            (out.moved, out.unmatched.clone()),
            (2, vec!["not_there".into()])
        );
        let (names, calls, export, slot0) = read(&out.module);
        assert_eq!(names, ["c", "b", "a"]);
        // Bodies keep calling the same functions by name, in the new order of bodies.
        assert_eq!(
            calls,
            [vec![], vec!["table".to_string()], vec!["c".to_string()]]
        );
        assert_eq!(export, "answer -> c");
        assert_eq!(slot0, "a", "table slots keep their functions");
        // The original, for contrast, and an empty list changes nothing but the encoding.
        let (names, ..) = read(&before);
        assert_eq!(names, ["a", "b", "c"]);
        let same = order(&before, &[]).unwrap();
        assert_eq!(same.moved, 0);
        assert_eq!(read(&same.module), read(&before));
    }

    #[test]
    fn list_names_are_demangled_and_fall_back_to_the_name_without_hash() {
        let full = "ailb_core::balancer::Balancer::on_request_headers::ha8edcc453a37bb8f";
        assert_eq!(
            list_name("_ZN9ailb_core8balancer8Balancer18on_request_headers17ha8edcc453a37bb8fE"),
            full
        );
        assert_eq!(
            without_hash(full),
            "ailb_core::balancer::Balancer::on_request_headers"
        );
        for plain in ["proxy_on_done", "a::hb", "x::h0123456789abcdeg"] {
            assert_eq!(
                (list_name(plain).as_str(), without_hash(plain)),
                (plain, plain)
            );
        }
    }

    /// Two instances of one generic: a line with one's hash moves that one; a line whose
    /// hash neither has (another build) moves both.
    #[test]
    fn a_hash_picks_one_instance_and_a_stale_hash_all_of_them() {
        let names = ["log", "g::h0000000000000001", "b", "g::h0000000000000002"];
        let wasm = renamed(&names);
        let one = order(&wasm, &["g::h0000000000000002".into()]).unwrap();
        assert_eq!(
            read(&one.module).0,
            ["g::h0000000000000002", "g::h0000000000000001", "b"]
        );
        let both = order(&wasm, &["g::hffffffffffffffff".into(), "b".into()]).unwrap();
        assert_eq!(
            (read(&both.module).0, both.unmatched),
            (
                vec![
                    "g::h0000000000000001".to_string(),
                    "g::h0000000000000002".into(),
                    "b".into()
                ],
                vec![]
            )
        );
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        let good = module();
        assert!(order(b"nope", &[]).is_err());
        for cut in 8..good.len() {
            let _ = order(&good[..cut], &["a".into()]);
        }
    }
}
