//! `wasm-abi globals FILE OUT`: the module with each pair of imports
//! `ailb_global.<name>_get: [] -> [t]` and `ailb_global.<name>_set: [t] -> []` made one
//! mutable global of type `t`, starting at zero. Each call of the getter becomes
//! `global.get`, each call of the setter `global.set`. `make build` runs it on both builds
//! before `order`.
//!
//! Why: Rust cannot declare a wasm global, and everything it does declare lives in linear
//! memory. A callback that reads only globals touches no page of the VM's memory, which for
//! a worker idle between callbacks is a page walk and a cache miss saved. The body watch
//! answers every chunk of a streamed answer from one (src/wasm_global.rs, docs/plugin-cpu.md
//! "Body chunks").
//!
//! The imports go, so every later function index moves down by their count;
//! `wasm_encoder::reencode` rewrites calls, `ref.func`, element segments, exports, the start
//! function and names for it. Refused, never guessed: a removed import used other than by a
//! call (exported, in a table, `ref.func`, `return_call`), a getter or setter of another
//! shape, a name with only one of the two, a type other than i32, i64, f32, f64.

use std::collections::BTreeMap;
use wasm_encoder::reencode::{utils, Error, Reencode};
use wasm_encoder::{ConstExpr, GlobalType, Instruction, ValType};
use wasmparser::{Operator, Parser, Payload, TypeRef};

/// The import module whose functions become globals.
pub const MODULE: &str = "ailb_global";

/// What a call of a removed import becomes: the global's index in the rewritten module.
#[derive(Debug, Clone, Copy)]
enum Access {
    Get(u32),
    Set(u32),
}

/// The rewrite, as `Scan::plan` made it.
struct Globals {
    /// Per imported function (old index): what its calls become, None when it stays.
    removed: Vec<Option<Access>>,
    /// Per imported function (old index): how many removed imports come before it.
    before: Vec<u32>,
    /// How many imports are removed: defined functions move down by this.
    removed_total: u32,
    /// Functions imported: defined functions begin here.
    imports: u32,
    /// The added globals' types, in index order.
    added: Vec<ValType>,
    /// Whether the added globals are written.
    written: bool,
}

impl Globals {
    fn add_globals(&mut self, globals: &mut wasm_encoder::GlobalSection) {
        for &ty in &self.added {
            let zero = match ty {
                ValType::I64 => ConstExpr::i64_const(0),
                ValType::F32 => ConstExpr::f32_const(0.0.into()),
                ValType::F64 => ConstExpr::f64_const(0.0.into()),
                _ => ConstExpr::i32_const(0),
            };
            let ty = GlobalType {
                val_type: ty,
                mutable: true,
                shared: false,
            };
            globals.global(ty, &zero);
        }
        self.written = true;
    }
}

impl Reencode for Globals {
    type Error = String;

    fn function_index(&mut self, func: u32) -> Result<u32, Error<String>> {
        if func >= self.imports {
            return Ok(func - self.removed_total);
        }
        let at = func as usize;
        match (self.removed.get(at), self.before.get(at)) {
            (Some(None), Some(&before)) => Ok(func - before),
            _ => Err(Error::UserError(format!(
                "function {func} is an {MODULE} import used other than by a call"
            ))),
        }
    }

    fn instruction<'a>(&mut self, op: Operator<'a>) -> Result<Instruction<'a>, Error<String>> {
        if let Operator::Call { function_index } = op {
            if let Some(Some(access)) = self.removed.get(function_index as usize) {
                return Ok(match *access {
                    Access::Get(g) => Instruction::GlobalGet(g),
                    Access::Set(g) => Instruction::GlobalSet(g),
                });
            }
        }
        utils::instruction(self, op)
    }

    fn parse_import_section(
        &mut self,
        imports: &mut wasm_encoder::ImportSection,
        section: wasmparser::ImportSectionReader<'_>,
    ) -> Result<(), Error<String>> {
        for import in section.into_imports() {
            let import = import?;
            if import.module != MODULE {
                let ty = self.entity_type(import.ty)?;
                imports.import(import.module, import.name, ty);
            }
        }
        Ok(())
    }

    fn parse_global_section(
        &mut self,
        globals: &mut wasm_encoder::GlobalSection,
        section: wasmparser::GlobalSectionReader<'_>,
    ) -> Result<(), Error<String>> {
        utils::parse_global_section(self, globals, section)?;
        self.add_globals(globals);
        Ok(())
    }

    /// A module without a global section gets one, where the format puts it: before the
    /// export section or whatever follows.
    fn intersperse_section_hook(
        &mut self,
        module: &mut wasm_encoder::Module,
        _after: Option<wasm_encoder::SectionId>,
        before: Option<wasm_encoder::SectionId>,
    ) -> Result<(), Error<String>> {
        use wasm_encoder::SectionId as S;
        let later = matches!(
            before,
            None | Some(S::Export | S::Start | S::Element | S::DataCount | S::Code | S::Data)
        );
        if !self.written && later {
            let mut globals = wasm_encoder::GlobalSection::new();
            self.add_globals(&mut globals);
            module.section(&globals);
        }
        Ok(())
    }

    /// The function names without the removed imports', renumbered.
    fn custom_name_section(
        &mut self,
        section: wasmparser::NameSectionReader<'_>,
    ) -> Result<wasm_encoder::NameSection, Error<String>> {
        let removed = self.removed.clone();
        let gone = move |f: u32| removed.get(f as usize).is_some_and(Option::is_some);
        crate::order::function_names(self, section, gone)
    }
}

/// One name's getter and setter, by old function index.
#[derive(Default)]
struct Pair {
    get: Option<u32>,
    set: Option<u32>,
}

fn val_type(t: wasmparser::ValType) -> Result<ValType, String> {
    Ok(match t {
        wasmparser::ValType::I32 => ValType::I32,
        wasmparser::ValType::I64 => ValType::I64,
        wasmparser::ValType::F32 => ValType::F32,
        wasmparser::ValType::F64 => ValType::F64,
        other => return Err(format!("{other}: a global here is i32, i64, f32 or f64")),
    })
}

/// A function type's parameters and results; None for a type that is not a function's.
type Shape = Option<(Vec<wasmparser::ValType>, Vec<wasmparser::ValType>)>;

/// What the rewrite needs to know of the module before it starts.
#[derive(Default)]
struct Scan {
    /// Every type of the type section.
    types: Vec<Shape>,
    /// Each imported function's type, by old index.
    import_types: Vec<u32>,
    /// Whether each imported function is an `ailb_global` one, by old index.
    ours: Vec<bool>,
    /// The `ailb_global` pairs by name.
    pairs: BTreeMap<String, Pair>,
    /// Globals imported and defined: the added ones come after them.
    globals: u32,
}

/// `ailb_global.<name>_get` → (`name`, true), `_set` → (`name`, false).
fn accessor(import: &str) -> Result<(&str, bool), String> {
    match (import.strip_suffix("_get"), import.strip_suffix("_set")) {
        (Some(name), _) => Ok((name, true)),
        (_, Some(name)) => Ok((name, false)),
        _ => Err(format!("{MODULE}.{import}: neither a _get nor a _set")),
    }
}

fn scan(wasm: &[u8]) -> Result<Scan, String> {
    let mut scan = Scan::default();
    for payload in Parser::new(0).parse_all(wasm) {
        match payload.map_err(|e| e.to_string())? {
            Payload::TypeSection(s) => {
                for group in s {
                    for ty in group.map_err(|e| e.to_string())?.into_types() {
                        scan.types.push(match ty.composite_type.inner {
                            wasmparser::CompositeInnerType::Func(f) => {
                                Some((f.params().to_vec(), f.results().to_vec()))
                            }
                            _ => None,
                        });
                    }
                }
            }
            Payload::ImportSection(s) => {
                for import in s.into_imports() {
                    let import = import.map_err(|e| e.to_string())?;
                    let ours = import.module == MODULE;
                    match import.ty {
                        TypeRef::Func(ty) => {
                            let index =
                                u32::try_from(scan.ours.len()).map_err(|e| e.to_string())?;
                            if ours {
                                let (name, getter) = accessor(import.name)?;
                                let pair = scan.pairs.entry(name.to_string()).or_default();
                                let slot = if getter { &mut pair.get } else { &mut pair.set };
                                if slot.replace(index).is_some() {
                                    return Err(format!("{MODULE}.{} twice", import.name));
                                }
                            }
                            scan.ours.push(ours);
                            scan.import_types.push(ty);
                        }
                        _ if ours => {
                            return Err(format!("{MODULE}.{}: not a function", import.name))
                        }
                        TypeRef::Global(_) => scan.globals = scan.globals.saturating_add(1),
                        _ => {}
                    }
                }
            }
            Payload::GlobalSection(s) => scan.globals = scan.globals.saturating_add(s.count()),
            _ => {}
        }
    }
    Ok(scan)
}

impl Scan {
    /// The global pair `name`'s type: the getter's `[] -> [t]` and the setter's `[t] -> []`.
    fn global_type(&self, name: &str, pair: &Pair) -> Result<ValType, String> {
        let (Some(get), Some(set)) = (pair.get, pair.set) else {
            return Err(format!("{MODULE}.{name}: a _get and a _set, or neither"));
        };
        let shape = |f: u32| -> Result<&(Vec<_>, Vec<_>), String> {
            let ty = self
                .import_types
                .get(f as usize)
                .copied()
                .unwrap_or(u32::MAX);
            self.types
                .get(ty as usize)
                .and_then(Option::as_ref)
                .ok_or_else(|| format!("{MODULE}.{name}: type {ty} is not a function type"))
        };
        match (shape(get)?, shape(set)?) {
            ((gp, gr), (sp, sr)) if gp.is_empty() && sr.is_empty() && gr == sp && gr.len() == 1 => {
                val_type(gr[0])
            }
            _ => Err(format!(
                "{MODULE}.{name}: the getter is [] -> [t] and the setter [t] -> []"
            )),
        }
    }

    /// The rewrite: each pair's calls to its global, after the module's own globals.
    fn plan(self) -> Result<Globals, String> {
        let mut removed = vec![None; self.ours.len()];
        let mut added = Vec::new();
        for (name, pair) in &self.pairs {
            let ty = self.global_type(name, pair)?;
            let index = u32::try_from(added.len())
                .ok()
                .and_then(|n| self.globals.checked_add(n))
                .ok_or("too many globals")?;
            added.push(ty);
            let accesses = [
                (pair.get, Access::Get(index)),
                (pair.set, Access::Set(index)),
            ];
            for (f, access) in accesses {
                if let Some(slot) = f.and_then(|f| removed.get_mut(f as usize)) {
                    *slot = Some(access);
                }
            }
        }
        let mut count = 0u32;
        let before = self
            .ours
            .iter()
            .map(|&gone| {
                let b = count;
                count += u32::from(gone);
                b
            })
            .collect();
        Ok(Globals {
            removed,
            before,
            removed_total: count,
            imports: u32::try_from(self.ours.len()).map_err(|e| e.to_string())?,
            added,
            written: false,
        })
    }
}

/// `wasm` with its `ailb_global` imports made globals (module doc); unchanged when it has
/// none.
pub fn globals(wasm: &[u8]) -> Result<Vec<u8>, String> {
    let scan = scan(wasm)?;
    if scan.pairs.is_empty() {
        return Ok(wasm.to_vec());
    }
    let mut g = scan.plan()?;
    let out = crate::order::rewrite(&mut g, wasm)?;
    if !g.written {
        return Err("no place for the globals was found".into());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use wasm_encoder::{
        CodeSection, ElementSection, Elements, EntityType, ExportKind, ExportSection, Function,
        FunctionSection, GlobalSection, ImportSection, Instruction as I, Module, NameMap,
        NameSection, RefType, TableSection, TableType, TypeSection,
    };

    /// Imports `env.log`, `ailb_global.w_get`, `ailb_global.w_set`, `env.other` (functions
    /// 0-3), then defined `bump` (4: w += 1, then calls log and other), `read` (5: returns
    /// w), `twice` (6: calls bump twice); one global of its own (`with_global`), `read` in
    /// table slot 0, every function exported under its name (`export_get` exports w_get
    /// too) and named.
    fn module(with_global: bool, export_get: bool) -> Vec<u8> {
        let mut m = Module::new();
        let mut types = TypeSection::new();
        types.ty().function([], [ValType::I64]);
        types.ty().function([ValType::I64], []);
        types.ty().function([], []);
        m.section(&types);
        let mut imports = ImportSection::new();
        imports.import("env", "log", EntityType::Function(2));
        imports.import(MODULE, "w_get", EntityType::Function(0));
        imports.import(MODULE, "w_set", EntityType::Function(1));
        imports.import("env", "other", EntityType::Function(2));
        m.section(&imports);
        let mut funcs = FunctionSection::new();
        for ty in [2, 0, 2] {
            funcs.function(ty);
        }
        m.section(&funcs);
        let mut tables = TableSection::new();
        tables.table(TableType {
            element_type: RefType::FUNCREF,
            table64: false,
            minimum: 1,
            maximum: None,
            shared: false,
        });
        m.section(&tables);
        if with_global {
            let mut globals = GlobalSection::new();
            let ty = GlobalType {
                val_type: ValType::I32,
                mutable: true,
                shared: false,
            };
            globals.global(ty, &ConstExpr::i32_const(1024));
            m.section(&globals);
        }
        let mut exports = ExportSection::new();
        for (name, f) in [("bump", 4), ("read", 5), ("twice", 6)] {
            exports.export(name, ExportKind::Func, f);
        }
        if export_get {
            exports.export("w_get", ExportKind::Func, 1);
        }
        m.section(&exports);
        let mut elements = ElementSection::new();
        let slot = [5u32];
        elements.active(
            Some(0),
            &ConstExpr::i32_const(0),
            Elements::Functions(slot[..].into()),
        );
        m.section(&elements);
        let mut code = CodeSection::new();
        let body = |ins: &[I]| {
            let mut f = Function::new([]);
            for i in ins {
                f.instruction(i);
            }
            f.instruction(&I::End);
            f
        };
        code.function(&body(&[
            I::Call(1),
            I::I64Const(1),
            I::I64Add,
            I::Call(2),
            I::Call(0),
            I::Call(3),
        ]));
        code.function(&body(&[I::Call(1)]));
        code.function(&body(&[I::Call(4), I::Call(4)]));
        m.section(&code);
        let mut names = NameMap::new();
        for (i, n) in ["log", "w_get", "w_set", "other", "bump", "read", "twice"]
            .iter()
            .enumerate()
        {
            names.append(i as u32, n);
        }
        let mut section = NameSection::new();
        section.functions(&names);
        m.section(&section);
        m.finish()
    }

    /// What a rewritten module holds: imports, globals (type, mutable), exports
    /// (name -> function name), table slot 0's function name, and each defined function's
    /// name with its body's calls and global accesses.
    #[derive(Debug, Default)]
    struct Seen {
        imports: Vec<String>,
        globals: Vec<(String, bool)>,
        exports: Vec<String>,
        slot: String,
        bodies: Vec<(String, Vec<String>)>,
    }

    fn read(wasm: &[u8]) -> Seen {
        wasmparser::Validator::new()
            .validate_all(wasm)
            .unwrap_or_else(|e| panic!("invalid module: {e}"));
        let names = crate::order::layout(wasm).unwrap().names;
        let name = |i: u32| names.get(&i).cloned().unwrap_or(format!("#{i}"));
        let mut seen = Seen::default();
        let mut defined = 0;
        for p in Parser::new(0).parse_all(wasm) {
            match p.unwrap() {
                Payload::ImportSection(s) => {
                    for i in s.into_imports() {
                        let i = i.unwrap();
                        seen.imports.push(format!("{}.{}", i.module, i.name));
                    }
                    defined = seen.imports.len() as u32;
                }
                Payload::GlobalSection(s) => {
                    for g in s {
                        let g = g.unwrap();
                        seen.globals
                            .push((format!("{}", g.ty.content_type), g.ty.mutable));
                    }
                }
                Payload::ExportSection(s) => {
                    for e in s {
                        let e = e.unwrap();
                        seen.exports
                            .push(format!("{} -> {}", e.name, name(e.index)));
                    }
                }
                Payload::ElementSection(s) => {
                    for e in s {
                        if let wasmparser::ElementItems::Functions(f) = e.unwrap().items {
                            seen.slot = name(f.into_iter().next().unwrap().unwrap());
                        }
                    }
                }
                Payload::CodeSectionEntry(b) => {
                    let mut ops = Vec::new();
                    for op in b.get_operators_reader().unwrap() {
                        match op.unwrap() {
                            Operator::Call { function_index } => {
                                ops.push(format!("call {}", name(function_index)))
                            }
                            Operator::GlobalGet { global_index } => {
                                ops.push(format!("global.get {global_index}"))
                            }
                            Operator::GlobalSet { global_index } => {
                                ops.push(format!("global.set {global_index}"))
                            }
                            _ => {}
                        }
                    }
                    seen.bodies.push((name(defined), ops));
                    defined += 1;
                }
                _ => {}
            }
        }
        seen
    }

    #[test]
    fn getter_and_setter_become_one_global_and_indices_follow() {
        for with_global in [true, false] {
            let out = globals(&module(with_global, false)).unwrap();
            let seen = read(&out);
            assert_eq!(seen.imports, ["env.log", "env.other"]);
            let w = if with_global { 1 } else { 0 };
            let mut want_globals = vec![("i64".to_string(), true)];
            if with_global {
                want_globals.insert(0, ("i32".to_string(), true));
            }
            assert_eq!(seen.globals, want_globals);
            assert_eq!(
                seen.bodies,
                [
                    (
                        "bump".to_string(),
                        vec![
                            format!("global.get {w}"),
                            format!("global.set {w}"),
                            "call log".into(),
                            "call other".into()
                        ]
                    ),
                    ("read".to_string(), vec![format!("global.get {w}")]),
                    (
                        "twice".to_string(),
                        vec!["call bump".into(), "call bump".into()]
                    ),
                ]
            );
            assert_eq!(
                seen.exports,
                ["bump -> bump", "read -> read", "twice -> twice"]
            );
            assert_eq!(seen.slot, "read");
        }
    }

    #[test]
    fn the_added_global_starts_at_zero() {
        let out = globals(&module(true, false)).unwrap();
        for p in Parser::new(0).parse_all(&out) {
            if let Payload::GlobalSection(s) = p.unwrap() {
                let g = s.into_iter().nth(1).unwrap().unwrap();
                let ops: Vec<_> = g
                    .init_expr
                    .get_operators_reader()
                    .into_iter()
                    .map(|o| format!("{:?}", o.unwrap()))
                    .collect();
                assert_eq!(ops, ["I64Const { value: 0 }", "End"]);
            }
        }
    }

    #[test]
    fn a_module_without_such_imports_is_left_as_it_is() {
        let mut m = Module::new();
        let mut types = TypeSection::new();
        types.ty().function([], [ValType::I64]);
        m.section(&types);
        let mut imports = ImportSection::new();
        imports.import("env", "w_get", EntityType::Function(0));
        m.section(&imports);
        let plain = m.finish();
        assert_eq!(globals(&plain).unwrap(), plain);
    }

    #[test]
    fn what_cannot_be_made_a_global_is_refused() {
        let err = globals(&module(true, true)).unwrap_err();
        assert!(err.contains("used other than by a call"), "{err}");
        assert!(globals(b"\0asm garbage").is_err());
        // Only a getter.
        let mut m = Module::new();
        let mut types = TypeSection::new();
        types.ty().function([], [ValType::I64]);
        types.ty().function([ValType::I32], [ValType::I64]);
        m.section(&types);
        let mut imports = ImportSection::new();
        imports.import(MODULE, "x_get", EntityType::Function(0));
        m.section(&imports);
        let lone = m.finish();
        assert!(globals(&lone).unwrap_err().contains("a _get and a _set"));
        // A setter that returns, a name that is neither, a global import.
        for (name, ty) in [
            ("x_set", EntityType::Function(0)),
            ("x_set", EntityType::Function(1)),
            ("x", EntityType::Function(0)),
        ] {
            let mut m = Module::new();
            m.section(&types);
            let mut imports = ImportSection::new();
            imports.import(MODULE, "x_get", EntityType::Function(0));
            imports.import(MODULE, name, ty);
            m.section(&imports);
            assert!(globals(&m.finish()).is_err(), "{name}");
        }
        let mut m = Module::new();
        let mut imports = ImportSection::new();
        let ty = wasm_encoder::GlobalType {
            val_type: ValType::I32,
            mutable: false,
            shared: false,
        };
        imports.import(MODULE, "g_get", EntityType::Global(ty));
        m.section(&imports);
        assert!(globals(&m.finish()).unwrap_err().contains("not a function"));
    }
}
