//! Just enough of the wasm binary format: sections, the import and export sections.

pub struct Import {
    pub module: String,
    pub name: String,
    pub kind: u8,
}

pub struct Export {
    pub name: String,
}

pub struct Module<'a> {
    bytes: &'a [u8],
    /// (section id, start of payload, end of payload, start of section header)
    sections: Vec<(u8, usize, usize, usize)>,
}

fn leb_u32(b: &[u8], pos: &mut usize) -> Result<u32, String> {
    let mut result: u32 = 0;
    for shift in (0..35).step_by(7) {
        let byte = *b.get(*pos).ok_or("truncated LEB128")?;
        *pos += 1;
        result |= u32::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Ok(result);
        }
    }
    Err("LEB128 too long".into())
}

fn name(b: &[u8], pos: &mut usize) -> Result<String, String> {
    let len = leb_u32(b, pos)? as usize;
    let s = b.get(*pos..*pos + len).ok_or("truncated name")?;
    *pos += len;
    String::from_utf8(s.to_vec()).map_err(|_| "name is not UTF-8".to_string())
}

fn push_leb(out: &mut Vec<u8>, mut v: u32) {
    loop {
        let byte = (v & 0x7f) as u8;
        v >>= 7;
        if v == 0 {
            out.push(byte);
            return;
        }
        out.push(byte | 0x80);
    }
}

impl<'a> Module<'a> {
    pub fn parse(bytes: &'a [u8]) -> Result<Module<'a>, String> {
        if bytes.get(0..8) != Some(b"\0asm\x01\0\0\0") {
            return Err("not a wasm module (bad magic/version)".into());
        }
        let mut pos = 8;
        let mut sections = Vec::new();
        while pos < bytes.len() {
            let header = pos;
            let id = bytes[pos];
            pos += 1;
            let size = leb_u32(bytes, &mut pos)? as usize;
            let end = pos
                .checked_add(size)
                .filter(|&e| e <= bytes.len())
                .ok_or("truncated section")?;
            sections.push((id, pos, end, header));
            pos = end;
        }
        Ok(Module { bytes, sections })
    }

    fn payload(&self, id: u8) -> Option<&'a [u8]> {
        self.sections
            .iter()
            .find(|s| s.0 == id)
            .map(|&(_, s, e, _)| &self.bytes[s..e])
    }

    pub fn imports(&self) -> Result<Vec<Import>, String> {
        let Some(p) = self.payload(2) else {
            return Ok(vec![]);
        };
        let mut pos = 0;
        let count = leb_u32(p, &mut pos)?;
        let mut out = Vec::new();
        for _ in 0..count {
            let module = name(p, &mut pos)?;
            let field = name(p, &mut pos)?;
            let kind = *p.get(pos).ok_or("truncated import")?;
            pos += 1;
            match kind {
                0 => {
                    leb_u32(p, &mut pos)?;
                }
                1 => {
                    pos += 1; // reftype
                    skip_limits(p, &mut pos)?;
                }
                2 => skip_limits(p, &mut pos)?,
                3 => pos += 2, // valtype + mutability
                _ => return Err(format!("unknown import kind {kind}")),
            }
            out.push(Import {
                module,
                name: field,
                kind,
            });
        }
        Ok(out)
    }

    pub fn exports(&self) -> Result<Vec<Export>, String> {
        Ok(self.export_entries()?.into_iter().map(|(e, _)| e).collect())
    }

    /// Exports with their raw bytes, for rewriting.
    fn export_entries(&self) -> Result<Vec<(Export, &'a [u8])>, String> {
        let Some(p) = self.payload(7) else {
            return Ok(vec![]);
        };
        let mut pos = 0;
        let count = leb_u32(p, &mut pos)?;
        let mut out = Vec::new();
        for _ in 0..count {
            let start = pos;
            let n = name(p, &mut pos)?;
            let kind = *p.get(pos).ok_or("truncated export")?;
            pos += 1;
            leb_u32(p, &mut pos)?;
            let _ = kind;
            out.push((Export { name: n }, &p[start..pos]));
        }
        Ok(out)
    }

    /// The module with the named exports removed (the functions themselves stay).
    pub fn without_exports(&self, drop: &[&str]) -> Result<Vec<u8>, String> {
        let kept: Vec<&[u8]> = self
            .export_entries()?
            .into_iter()
            .filter(|(e, _)| !drop.contains(&e.name.as_str()))
            .map(|(_, raw)| raw)
            .collect();
        let mut payload = Vec::new();
        push_leb(&mut payload, kept.len() as u32);
        for raw in kept {
            payload.extend_from_slice(raw);
        }
        let mut out = self.bytes[..8].to_vec();
        for &(id, start, end, header) in &self.sections {
            if id == 7 {
                out.push(7);
                push_leb(&mut out, payload.len() as u32);
                out.extend_from_slice(&payload);
            } else {
                out.extend_from_slice(&self.bytes[header..end]);
                let _ = start;
            }
        }
        Ok(out)
    }
}

fn skip_limits(p: &[u8], pos: &mut usize) -> Result<(), String> {
    let flags = *p.get(*pos).ok_or("truncated limits")?;
    *pos += 1;
    leb_u32(p, pos)?;
    if flags & 1 == 1 {
        leb_u32(p, pos)?;
    }
    Ok(())
}
