// A small code highlighter: one regex scan per block, tokens become <span> elements whose
// text is set with textContent (the code is never parsed as HTML). Not a parser: comments,
// strings, numbers, keywords and literals, for the languages models write most.

const C_LIKE = { line: "//", block: true, hash: false };
const HASH = { line: "#", block: false, hash: true };

const KEYWORDS = {
  js: "async await break case catch class const continue debugger default delete do else export extends finally for from function if import in instanceof let new of return static super switch this throw try typeof var void while with yield interface type enum implements",
  python: "and as assert async await break class continue def del elif else except finally for from global if import in is lambda nonlocal not or pass raise return try while with yield match case self",
  c: "auto break case char const continue default do double else enum extern float for goto if inline int long register return short signed sizeof static struct switch typedef union unsigned void volatile while bool class namespace template typename public private protected virtual override new delete using std include define",
  rust: "as async await break const continue crate else enum extern fn for if impl in let loop match mod move mut pub ref return self Self static struct super trait type unsafe use where while dyn",
  go: "break case chan const continue default defer else fallthrough for func go goto if import interface map package range return select struct switch type var",
  java: "abstract boolean break byte case catch char class const continue default do double else enum extends final finally float for if implements import instanceof int interface long native new package private protected public return short static super switch synchronized this throw throws try void volatile while var",
  bash: "if then else elif fi for while do done case esac function in return local export echo set unset exit source",
  sql: "select from where and or not insert into values update set delete create table drop alter index join left right inner outer on group by order having limit as distinct union null is in like between case when then else end primary key",
  json: "",
};
const LITERALS = "true false null None True False nil undefined NaN";
const ALIASES = {
  javascript: "js", ts: "js", typescript: "js", jsx: "js", tsx: "js", mjs: "js",
  py: "python", python3: "python", cpp: "c", "c++": "c", h: "c", hpp: "c", cc: "c",
  cs: "java", csharp: "java", kotlin: "java", swift: "java", rs: "rust", golang: "go",
  sh: "bash", shell: "bash", zsh: "bash", console: "bash", yaml: "bash", yml: "bash",
  toml: "bash", ruby: "bash", rb: "bash", postgres: "sql", mysql: "sql", sqlite: "sql",
};

const cache = new Map();

function rules(lang) {
  const name = ALIASES[lang] || lang;
  if (!(name in KEYWORDS)) return null;
  if (cache.has(name)) return cache.get(name);
  const syntax = ["python", "bash"].includes(name) ? HASH
    : name === "sql" ? { line: "--", block: true, hash: false }
    : name === "json" ? { line: null, block: false, hash: false } : C_LIKE;
  const parts = [];
  if (syntax.line) parts.push(`${syntax.line === "#" ? "#" : syntax.line.replace(/\//g, "\\/")}[^\\n]*`);
  if (syntax.block) parts.push("\\/\\*[\\s\\S]*?(?:\\*\\/|$)");
  const comment = parts.join("|");
  const strings = name === "python" ? `"""[\\s\\S]*?(?:"""|$)|'''[\\s\\S]*?(?:'''|$)|` : "";
  const string = `${strings}"(?:[^"\\\\\\n]|\\\\.)*"?|'(?:[^'\\\\\\n]|\\\\.)*'?` +
    (name === "js" || name === "go" ? "|`(?:[^`\\\\]|\\\\.)*`?" : "");
  const re = new RegExp(
    `(${comment || "(?!)"})|(${string})|(\\b(?:0x[0-9a-fA-F]+|\\d+(?:\\.\\d+)?(?:[eE][+-]?\\d+)?)\\b)|([A-Za-z_$][\\w$]*)`,
    "g");
  const keywords = new Set(KEYWORDS[name].split(" ").filter(Boolean));
  const literals = new Set(LITERALS.split(" "));
  const r = { re, keywords, literals };
  cache.set(name, r);
  return r;
}

function span(cls, text) {
  const s = document.createElement("span");
  s.className = cls;
  s.textContent = text;
  return s;
}

// Fill `codeEl` with `code`, highlighted when `lang` is one we know.
export function highlightInto(codeEl, code, lang) {
  const r = rules((lang || "").toLowerCase());
  if (!r) {
    codeEl.textContent = code;
    return;
  }
  const frag = document.createDocumentFragment();
  let last = 0;
  r.re.lastIndex = 0;
  for (let m; (m = r.re.exec(code)); ) {
    if (m[0] === "") { r.re.lastIndex++; continue; }
    if (m.index > last) frag.append(code.slice(last, m.index));
    let cls = null;
    if (m[1]) cls = "tok-com";
    else if (m[2]) cls = "tok-str";
    else if (m[3]) cls = "tok-num";
    else if (m[4]) {
      if (r.keywords.has(m[4])) cls = "tok-kw";
      else if (r.literals.has(m[4])) cls = "tok-lit";
      else if (code[r.re.lastIndex] === "(") cls = "tok-fn";
    }
    frag.append(cls ? span(cls, m[0]) : m[0]);
    last = r.re.lastIndex;
  }
  if (last < code.length) frag.append(code.slice(last));
  codeEl.replaceChildren(frag);
}
