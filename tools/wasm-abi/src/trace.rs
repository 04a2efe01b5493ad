//! `wasm-abi trace-memory FILE OUT`: the module with every access to linear memory reported
//! to the host first, through one added import, `ailb_trace.touch(address, length,
//! function)`. A bench instrument, never shipped: `ailb-footprint --trace` runs such a module and counts the
//! 64-byte lines and 4 KiB pages of data each request touches, by address, which the statics
//! of the linker's map and the heap's contents then name (docs/plugin-cpu.md "Data pages").
//!
//! Why: for a worker idle between requests every page a request touches is a page walk, data
//! as much as code. `/proc/self/smaps` counts the pages (`ailb-footprint --pages`) but cannot
//! say what is on them.
//!
//! Each load and store saves its operands in added locals, reports `address + offset` and
//! its width, and runs as before; `memory.copy`, `memory.fill` and `memory.init` report their
//! destination (and source) ranges. Atomic and SIMD accesses are refused: the plugin's
//! target has neither. The import goes after the others, so every defined function's index
//! moves up by one; `wasm_encoder::reencode` rewrites calls, `ref.func`, element segments,
//! exports, the start function and names for it.

use wasm_encoder::reencode::{utils, Error, Reencode};
use wasm_encoder::{Instruction, ValType};
use wasmparser::{Operator, Parser, Payload, TypeRef};

/// The added import.
pub const MODULE: &str = "ailb_trace";
pub const NAME: &str = "touch";

/// What the rewrite needs to know of the module before it starts.
struct Trace {
    /// Imported functions: the new import's index, and where defined functions begin.
    imports: u32,
    /// Types in the type section: the new import's type goes after them.
    types: u32,
    /// Parameters of each defined function, in order: the added locals come after them and
    /// the function's own.
    params: Vec<u32>,
    /// The next defined function's position in `params`.
    next: usize,
    /// Whether the import section, with the added import, is written.
    imported: bool,
}

impl Trace {
    /// `ailb_trace.touch`, after the module's own imports.
    fn add_import(&mut self, imports: &mut wasm_encoder::ImportSection) {
        imports.import(MODULE, NAME, wasm_encoder::EntityType::Function(self.types));
        self.imported = true;
    }
}

impl Reencode for Trace {
    type Error = String;

    fn function_index(&mut self, func: u32) -> Result<u32, Error<String>> {
        Ok(if func < self.imports { func } else { func + 1 })
    }

    fn parse_type_section(
        &mut self,
        types: &mut wasm_encoder::TypeSection,
        section: wasmparser::TypeSectionReader<'_>,
    ) -> Result<(), Error<String>> {
        utils::parse_type_section(self, types, section)?;
        types
            .ty()
            .function([ValType::I32, ValType::I32, ValType::I32], []);
        Ok(())
    }

    fn parse_import_section(
        &mut self,
        imports: &mut wasm_encoder::ImportSection,
        section: wasmparser::ImportSectionReader<'_>,
    ) -> Result<(), Error<String>> {
        utils::parse_import_section(self, imports, section)?;
        self.add_import(imports);
        Ok(())
    }

    /// A module without imports gets an import section, where the format puts it: after the
    /// type section.
    fn intersperse_section_hook(
        &mut self,
        module: &mut wasm_encoder::Module,
        after: Option<wasm_encoder::SectionId>,
        before: Option<wasm_encoder::SectionId>,
    ) -> Result<(), Error<String>> {
        use wasm_encoder::SectionId;
        if !self.imported && after == Some(SectionId::Type) && before != Some(SectionId::Import) {
            let mut imports = wasm_encoder::ImportSection::new();
            self.add_import(&mut imports);
            module.section(&imports);
        }
        Ok(())
    }

    fn parse_function_body(
        &mut self,
        code: &mut wasm_encoder::CodeSection,
        func: wasmparser::FunctionBody<'_>,
    ) -> Result<(), Error<String>> {
        let position = self.next;
        let params = *self
            .params
            .get(position)
            .ok_or_else(|| Error::UserError("more bodies than functions".into()))?;
        self.next += 1;
        let too_many = || Error::UserError("more locals than an index holds".into());
        let mut locals = Vec::new();
        let mut declared = 0u32;
        for pair in func.get_locals_reader()? {
            let (count, ty) = pair?;
            declared = declared.checked_add(count).ok_or_else(too_many)?;
            locals.push((count, self.val_type(ty)?));
        }
        // Added locals: three i32 (an address, a second address or value, a length), then
        // one of each other value type a store may hold.
        let base = params
            .checked_add(declared)
            .filter(|b| b.checked_add(5).is_some())
            .ok_or_else(too_many)?;
        locals.extend([
            (3, ValType::I32),
            (1, ValType::I64),
            (1, ValType::F32),
            (1, ValType::F64),
        ]);
        let l = Locals {
            a: base,
            b: base + 1,
            n: base + 2,
            i64: base + 3,
            f32: base + 4,
            f64: base + 5,
            touch: self.imports,
            func: {
                let old = u32::try_from(position).map_err(|_| too_many())?;
                self.function_index(self.imports + old)?
            },
        };
        let mut f = wasm_encoder::Function::new(locals);
        let mut reader = func.get_operators_reader()?;
        while !reader.eof() {
            let op = reader.read()?;
            let access = access(&op)?;
            let ins = self.instruction(op)?;
            if let Some(access) = access {
                l.report(&mut f, access);
            }
            f.instruction(&ins);
        }
        code.function(&f);
        Ok(())
    }
}

/// The added locals of one function, and the import's index.
struct Locals {
    a: u32,
    b: u32,
    n: u32,
    i64: u32,
    f32: u32,
    f64: u32,
    touch: u32,
    /// This function's index in the traced module, reported with each access.
    func: u32,
}

/// How an instruction reaches memory: its operands on the stack, and what it touches.
#[derive(Clone, Copy)]
enum Access {
    /// `[address] -> …`: `width` bytes at `address + offset`.
    Load { offset: u64, width: i32 },
    /// `[address, value] -> []`.
    Store {
        offset: u64,
        width: i32,
        value: ValType,
    },
    /// `[destination, source, length]`.
    Copy,
    /// `[destination, byte, length]` (`memory.fill`) or `[destination, source in a data
    /// segment, length]` (`memory.init`): the destination only.
    Fill,
}

fn access(op: &Operator) -> Result<Option<Access>, Error<String>> {
    use Operator as O;
    let load = |m: &wasmparser::MemArg, width| Access::Load {
        offset: m.offset,
        width,
    };
    let store = |m: &wasmparser::MemArg, width, value| Access::Store {
        offset: m.offset,
        width,
        value,
    };
    Ok(Some(match op {
        O::I32Load { memarg } | O::F32Load { memarg } => load(memarg, 4),
        O::I64Load { memarg } | O::F64Load { memarg } => load(memarg, 8),
        O::I32Load8S { memarg }
        | O::I32Load8U { memarg }
        | O::I64Load8S { memarg }
        | O::I64Load8U { memarg } => load(memarg, 1),
        O::I32Load16S { memarg }
        | O::I32Load16U { memarg }
        | O::I64Load16S { memarg }
        | O::I64Load16U { memarg } => load(memarg, 2),
        O::I64Load32S { memarg } | O::I64Load32U { memarg } => load(memarg, 4),
        O::I32Store { memarg } => store(memarg, 4, ValType::I32),
        O::I32Store8 { memarg } => store(memarg, 1, ValType::I32),
        O::I32Store16 { memarg } => store(memarg, 2, ValType::I32),
        O::I64Store { memarg } => store(memarg, 8, ValType::I64),
        O::I64Store8 { memarg } => store(memarg, 1, ValType::I64),
        O::I64Store16 { memarg } => store(memarg, 2, ValType::I64),
        O::I64Store32 { memarg } => store(memarg, 4, ValType::I64),
        O::F32Store { memarg } => store(memarg, 4, ValType::F32),
        O::F64Store { memarg } => store(memarg, 8, ValType::F64),
        O::MemoryCopy { .. } => Access::Copy,
        O::MemoryFill { .. } | O::MemoryInit { .. } => Access::Fill,
        other => {
            // SIMD and atomic accesses (`V128Load…`, `I32AtomicStore…`, `MemoryAtomic…`).
            let name = format!("{other:?}");
            if name.contains("Load") || name.contains("Store") || name.contains("Atomic") {
                return Err(Error::UserError(format!(
                    "{name}: a memory access trace-memory does not handle"
                )));
            }
            return Ok(None);
        }
    }))
}

impl Locals {
    /// Before the access: its operands into locals, the touch reported, the operands back.
    fn report(&self, f: &mut wasm_encoder::Function, access: Access) {
        let touch = |f: &mut wasm_encoder::Function, at: u32, offset: u64, width: Option<i32>| {
            f.instruction(&Instruction::LocalGet(at));
            if offset != 0 {
                // Wrapping, as the access's own address arithmetic is in 32 bits.
                f.instruction(&Instruction::I32Const(offset as i32));
                f.instruction(&Instruction::I32Add);
            }
            match width {
                Some(w) => f.instruction(&Instruction::I32Const(w)),
                None => f.instruction(&Instruction::LocalGet(self.n)),
            };
            f.instruction(&Instruction::I32Const(self.func as i32));
            f.instruction(&Instruction::Call(self.touch));
        };
        match access {
            Access::Load { offset, width } => {
                f.instruction(&Instruction::LocalSet(self.a));
                touch(f, self.a, offset, Some(width));
                f.instruction(&Instruction::LocalGet(self.a));
            }
            Access::Store {
                offset,
                width,
                value,
            } => {
                let v = self.value(value);
                f.instruction(&Instruction::LocalSet(v));
                f.instruction(&Instruction::LocalSet(self.a));
                touch(f, self.a, offset, Some(width));
                f.instruction(&Instruction::LocalGet(self.a));
                f.instruction(&Instruction::LocalGet(v));
            }
            Access::Copy | Access::Fill => {
                f.instruction(&Instruction::LocalSet(self.n));
                f.instruction(&Instruction::LocalSet(self.b));
                f.instruction(&Instruction::LocalSet(self.a));
                touch(f, self.a, 0, None);
                if matches!(access, Access::Copy) {
                    touch(f, self.b, 0, None);
                }
                f.instruction(&Instruction::LocalGet(self.a));
                f.instruction(&Instruction::LocalGet(self.b));
                f.instruction(&Instruction::LocalGet(self.n));
            }
        }
    }

    fn value(&self, ty: ValType) -> u32 {
        match ty {
            ValType::I64 => self.i64,
            ValType::F32 => self.f32,
            ValType::F64 => self.f64,
            _ => self.b,
        }
    }
}

/// `wasm` with its memory accesses reported (module doc).
pub fn trace_memory(wasm: &[u8]) -> Result<Vec<u8>, String> {
    let mut imports = 0u32;
    let mut type_params: Vec<u32> = Vec::new();
    let mut params = Vec::new();
    for payload in Parser::new(0).parse_all(wasm) {
        match payload.map_err(|e| e.to_string())? {
            Payload::TypeSection(s) => {
                for group in s {
                    for ty in group.map_err(|e| e.to_string())?.into_types() {
                        let n = match ty.composite_type.inner {
                            wasmparser::CompositeInnerType::Func(f) => f.params().len(),
                            _ => 0,
                        };
                        type_params.push(u32::try_from(n).map_err(|e| e.to_string())?);
                    }
                }
            }
            Payload::ImportSection(s) => {
                for import in s.into_imports() {
                    let import = import.map_err(|e| e.to_string())?;
                    if import.module == MODULE {
                        return Err(format!("already traced: it imports {MODULE}.{NAME}"));
                    }
                    if matches!(import.ty, TypeRef::Func(_)) {
                        imports += 1;
                    }
                }
            }
            Payload::FunctionSection(s) => {
                for ty in s {
                    let ty = ty.map_err(|e| e.to_string())?;
                    let n = type_params
                        .get(ty as usize)
                        .ok_or_else(|| format!("function type {ty} does not exist"))?;
                    params.push(*n);
                }
            }
            _ => {}
        }
    }
    if type_params.is_empty() {
        return Err("no type section: nothing to trace".into());
    }
    let mut trace = Trace {
        imports,
        types: u32::try_from(type_params.len()).map_err(|e| e.to_string())?,
        params,
        next: 0,
        imported: false,
    };
    let traced = crate::order::rewrite(&mut trace, wasm)?;
    if !trace.imported {
        return Err("no place for the import was found".into());
    }
    Ok(traced)
}

#[cfg(test)]
mod tests {
    use super::*;
    use wasm_encoder::{
        CodeSection, ExportKind, ExportSection, Function, FunctionSection, ImportSection,
        Instruction as I, MemArg, MemorySection, MemoryType, Module, TypeSection,
    };

    fn arg(offset: u64) -> MemArg {
        MemArg {
            offset,
            align: 0,
            target: wasm_encoder::MemArgTarget::Memory(0),
            ordering: None,
        }
    }

    /// Functions: `load(a) -> i32` (i32.load offset 4), `store(a, v: i64)` (i64.store
    /// offset 8, then calls `load`), `copy(d, s, n)` (memory.copy, memory.fill); with or
    /// without one imported function.
    fn module(with_import: bool) -> Vec<u8> {
        let mut m = Module::new();
        let mut types = TypeSection::new();
        types.ty().function([ValType::I32], [ValType::I32]);
        types.ty().function([ValType::I32, ValType::I64], []);
        types
            .ty()
            .function([ValType::I32, ValType::I32, ValType::I32], []);
        m.section(&types);
        if with_import {
            let mut imports = ImportSection::new();
            imports.import("env", "log", wasm_encoder::EntityType::Function(0));
            m.section(&imports);
        }
        let mut funcs = FunctionSection::new();
        for ty in [0, 1, 2] {
            funcs.function(ty);
        }
        m.section(&funcs);
        let mut memories = MemorySection::new();
        memories.memory(MemoryType {
            minimum: 1,
            maximum: None,
            memory64: false,
            shared: false,
            page_size_log2: None,
        });
        m.section(&memories);
        let first = u32::from(with_import);
        let mut exports = ExportSection::new();
        exports.export("store", ExportKind::Func, first + 1);
        m.section(&exports);
        let mut code = CodeSection::new();
        let body = |locals: Vec<(u32, ValType)>, ins: &[I]| {
            let mut f = Function::new(locals);
            for i in ins {
                f.instruction(i);
            }
            f.instruction(&I::End);
            f
        };
        code.function(&body(vec![], &[I::LocalGet(0), I::I32Load(arg(4))]));
        code.function(&body(
            vec![(1, ValType::F64)],
            &[
                I::LocalGet(0),
                I::LocalGet(1),
                I::I64Store(arg(8)),
                I::LocalGet(0),
                I::Call(first),
                I::Drop,
            ],
        ));
        code.function(&body(
            vec![],
            &[
                I::LocalGet(0),
                I::LocalGet(1),
                I::LocalGet(2),
                I::MemoryCopy {
                    src_mem: 0,
                    dst_mem: 0,
                },
                I::LocalGet(0),
                I::I32Const(7),
                I::LocalGet(2),
                I::MemoryFill(0),
            ],
        ));
        m.section(&code);
        m.finish()
    }

    fn validate(wasm: &[u8]) {
        wasmparser::Validator::new()
            .validate_all(wasm)
            .unwrap_or_else(|e| panic!("invalid traced module: {e}"));
    }

    /// The operators of each defined function of `wasm`.
    fn bodies(wasm: &[u8]) -> Vec<Vec<String>> {
        let mut out = Vec::new();
        for p in Parser::new(0).parse_all(wasm) {
            if let Payload::CodeSectionEntry(b) = p.unwrap() {
                let ops = b.get_operators_reader().unwrap();
                out.push(
                    ops.into_iter()
                        .map(|o| format!("{:?}", o.unwrap()))
                        .collect(),
                );
            }
        }
        out
    }

    fn count(body: &[String], what: &str) -> usize {
        body.iter().filter(|o| o.starts_with(what)).count()
    }

    #[test]
    fn every_access_is_reported_before_it_runs_and_calls_follow_the_shift() {
        let traced = trace_memory(&module(true)).unwrap();
        validate(&traced);
        let b = bodies(&traced);
        assert_eq!(b.len(), 3);
        // The import is function 1 (after `log`); `load` moved from 1 to 2.
        assert_eq!(count(&b[0], "Call { function_index: 1 }"), 1, "{:?}", b[0]);
        assert!(
            b[0].contains(&"I32Const { value: 4 }".to_string()),
            "offset"
        );
        assert_eq!(count(&b[1], "Call { function_index: 1 }"), 1, "the store");
        assert_eq!(
            count(&b[1], "Call { function_index: 2 }"),
            1,
            "the call to load"
        );
        // Copy reports both ranges, fill its destination.
        assert_eq!(count(&b[2], "Call { function_index: 1 }"), 3, "{:?}", b[2]);
        let exports: Vec<u32> = Parser::new(0)
            .parse_all(&traced)
            .filter_map(|p| match p.unwrap() {
                Payload::ExportSection(s) => Some(s.into_iter().map(|e| e.unwrap().index)),
                _ => None,
            })
            .flatten()
            .collect();
        assert_eq!(exports, [3], "`store` is function 3 now");
    }

    #[test]
    fn a_module_without_imports_gets_one_and_a_traced_module_is_refused() {
        let traced = trace_memory(&module(false)).unwrap();
        validate(&traced);
        let b = bodies(&traced);
        assert_eq!(count(&b[0], "Call { function_index: 0 }"), 1, "{:?}", b[0]);
        assert_eq!(
            count(&b[1], "Call { function_index: 1 }"),
            1,
            "load is 1 now"
        );
        assert!(trace_memory(&traced)
            .unwrap_err()
            .contains("already traced"));
        assert!(trace_memory(b"\0asm garbage").is_err());
    }
}
