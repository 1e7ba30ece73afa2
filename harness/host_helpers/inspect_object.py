"""Inspect one Python object, or grep one package's source, as THIS interpreter sees it.

Called by `harness inspect` through harness/helpers.py (its source, then the request on stdin) and
run by the stage interpreter (on the host, or inside the container), so it answers with exactly
the files, versions and environment the stages get. No file needs to exist on the remote.
STDLIB ONLY, one self-contained file: it must run in any Python >= 3.8 the remote has.

Request (JSON on stdin; argv[1] by hand): {"op": "object" | "objects" | "grep", ...}. A dotted path
resolves `static` (the module's file parsed, nothing executed), `import` (the live object,
unwrapped) or `auto` (static, falling back to import whenever static cannot be sure).
Result: ONE line on stdout, MARKER followed by a JSON object.

The requests and the two ways to resolve a path: docs/architecture/host-helpers.md, "Host helpers' requests
and replies".
"""

import ast
import builtins
import difflib
import functools
import importlib
import inspect
import json
import os
import re
import sys
import sysconfig
import time
import traceback

MARKER = "@@harness-inspect@@ "
IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
MAX_REPR = 2000
PROPERTY_DECORATORS = ("property", "cached_property", "functools.cached_property")


class Failure(Exception):
    """An answer that is an error (unknown name, failed import, bad request)."""

    def __init__(self, kind, message, **fields):
        super().__init__(message)
        self.payload = {"kind": kind, "message": message, **fields}


# ---------------------------------------------------------------------------------------------
# Finding modules without executing them


def find_spec_no_exec(fullname, parent_locations):
    """The import system's spec for `fullname`, asking sys.meta_path's finders directly so that
    no parent package's __init__ runs (importlib.util.find_spec would import the parents)."""
    for finder in sys.meta_path:
        find = getattr(finder, "find_spec", None)
        if find is None:
            continue
        try:
            spec = find(fullname, parent_locations, None)
        except Exception:
            continue
        if spec is not None:
            return spec
    return None


def locate_module(parts):
    """Longest prefix of `parts` that names a module, found without executing anything.
    Returns (spec, number_of_parts_used) or (None, 0)."""
    spec = find_spec_no_exec(parts[0], None)
    if spec is None:
        return None, 0
    used = 1
    while used < len(parts) and spec.submodule_search_locations is not None:
        sub = find_spec_no_exec(".".join(parts[: used + 1]), list(spec.submodule_search_locations))
        if sub is None:
            break
        spec, used = sub, used + 1
    return spec, used


def read_source(path):
    # Universal newlines, like the tokenizer and linecache: ast line numbers match the file's.
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.read()


# ---------------------------------------------------------------------------------------------
# Distribution (name, version) a file belongs to, without importing the package


def distribution_of(top_package, file):
    if file and is_stdlib_file(file):
        return {"name": "python (stdlib)", "version": sys.version.split()[0]}
    try:
        import importlib.metadata as metadata
    except ImportError:  # Python < 3.8
        return None
    # Fast path: the distribution is usually named after its top-level package; confirm it by
    # its RECORD rather than trusting the name.
    for candidate in (top_package, top_package.replace("_", "-")):
        try:
            dist = metadata.distribution(candidate)
        except Exception:
            continue
        if dist_owns(dist, top_package):
            return {"name": dist.metadata["Name"], "version": dist.version}
    try:  # slow path: every installed distribution's top-level names
        names = metadata.packages_distributions().get(top_package) or []
    except Exception:
        names = []
    for name in names:
        try:
            return {"name": name, "version": metadata.version(name)}
        except Exception:
            continue
    return None


def dist_owns(dist, top_package):
    """Whether a distribution installs the top-level package (by its RECORD, read as text:
    torch's RECORD has ~15,000 lines, too many to parse into path objects)."""
    try:
        top_level = (dist.read_text("top_level.txt") or "").split()
    except Exception:
        top_level = []
    if top_package in top_level:
        return True
    try:
        record = "\n" + (dist.read_text("RECORD") or "")
    except Exception:
        return False
    return ("\n%s/" % top_package) in record or ("\n%s.py," % top_package) in record


def is_stdlib_file(file):
    stdlib = sysconfig.get_paths().get("stdlib") or ""
    real = os.path.realpath(file)
    return bool(stdlib) and real.startswith(os.path.realpath(stdlib) + os.sep) and "site-packages" not in real and "dist-packages" not in real


# ---------------------------------------------------------------------------------------------
# Static resolution: parse the file, walk class/def statements


def bound_names(statements):
    """name -> number of times it is bound by the statements of one scope (descending into
    if/try/with/for bodies, which bind in the same scope, but not into defs or classes)."""
    counts = {}

    def bump(name):
        counts[name] = counts.get(name, 0) + 1

    def targets(node):
        if isinstance(node, ast.Name):
            bump(node.id)
        elif isinstance(node, (ast.Tuple, ast.List)):
            for elt in node.elts:
                targets(elt)
        elif isinstance(node, ast.Starred):
            targets(node.value)

    def visit(stmts):
        for node in stmts:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                bump(node.name)
            elif isinstance(node, ast.Assign):
                for t in node.targets:
                    targets(t)
            elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
                if node.value is not None or isinstance(node, ast.AugAssign):
                    targets(node.target)
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                for alias in node.names:
                    bump((alias.asname or alias.name).split(".")[0])
            elif isinstance(node, (ast.For, ast.AsyncFor)):
                targets(node.target)
            elif isinstance(node, (ast.With, ast.AsyncWith)):
                for item in node.items:
                    if item.optional_vars is not None:
                        targets(item.optional_vars)
            for field in ("body", "orelse", "finalbody"):
                if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    visit(getattr(node, field, []) or [])
            for handler in getattr(node, "handlers", []) or []:
                visit(handler.body)
            for case in getattr(node, "cases", []) or []:
                visit(case.body)

    visit(statements)
    return counts


def unparse(node):
    try:
        return ast.unparse(node)
    except Exception:  # Python < 3.9
        return "<decorator>"


def decorator_name(text):
    """'torch.no_grad()' -> 'torch.no_grad'; 'foo.setter' -> 'setter' (property setters)."""
    name = text.split("(", 1)[0].strip()
    if name.endswith((".setter", ".getter", ".deleter")):
        return "property"
    return name


def static_signature(node):
    if isinstance(node, ast.ClassDef):
        for item in node.body:
            if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name == "__init__":
                return static_signature(item)
        return None
    try:
        text = "(" + ast.unparse(node.args) + ")"
        if node.returns is not None:
            text += " -> " + ast.unparse(node.returns)
        return text
    except Exception:
        return None


def parse_file(file):
    """(text, tree) of a source file, or None if it cannot be read or parsed."""
    try:
        text = read_source(file)
        return text, ast.parse(text, filename=file)
    except (OSError, SyntaxError, ValueError):
        return None


def find_definition(tree, names):
    """The def/class statement that binds names[0].names[1]... (classes only in between),
    or None when the binding is not a single plain def/class (absent, inherited, assigned,
    imported, rebound, or under a module-level __getattr__)."""
    if "__getattr__" in bound_names(tree.body):
        return None
    scope, node = tree, None
    for i, name in enumerate(names):
        if bound_names(scope.body).get(name) != 1:
            return None
        node = next((n for n in scope.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and n.name == name), None)
        if node is None or (i < len(names) - 1 and not isinstance(node, ast.ClassDef)):
            return None
        scope = node
    return node


def definition_facts(node, text, in_class):
    """kind, lines, source, signature, docstring and decorators of one def/class statement."""
    lines = text.split("\n")
    decorators = [unparse(d) for d in node.decorator_list]
    # Like inspect.getsourcelines: a decorated definition starts at its first decorator.
    first = min([node.lineno] + [d.lineno for d in node.decorator_list])
    last = getattr(node, "end_lineno", None) or node.lineno
    if isinstance(node, ast.ClassDef):
        kind = "class"
    elif any(decorator_name(d) in PROPERTY_DECORATORS for d in decorators):
        kind = "property"
    else:
        kind = "method" if in_class else "function"
    return {
        "kind": kind,
        "first_line": first,
        "last_line": last,
        "source": "\n".join(lines[first - 1:last]) + "\n",
        "signature": static_signature(node),
        "doc": ast.get_docstring(node),
        "decorators": decorators,
    }


def line_count(text):
    return text.count("\n") + (0 if text.endswith("\n") or not text else 1)


def resolve_static(path, want_mro):
    """The answer without importing, or None when only an import can be sure."""
    if want_mro:
        return None
    parts = path.split(".")
    spec, used = locate_module(parts)
    if spec is None or not spec.has_location or not (spec.origin or "").endswith(".py"):
        return None
    file = spec.origin
    parsed = parse_file(file)
    if parsed is None:
        return None
    text, tree = parsed
    module_name, rest = ".".join(parts[:used]), parts[used:]
    result = base_result(path, "static")
    if not rest:
        result.update(kind="module", qualname=module_name, first_line=1, last_line=line_count(text),
                      source=text, doc=ast.get_docstring(tree))
    else:
        node = find_definition(tree, rest)
        if node is None:
            return None
        result.update(definition_facts(node, text, in_class=len(rest) > 1), qualname=".".join(rest))
    result.update(module=module_name, file=file, dist=distribution_of(parts[0], file))
    return result


# ---------------------------------------------------------------------------------------------
# Import resolution: import the longest module prefix, getattr down the rest, unwrap


def is_machinery(filename):
    """The import system's frames and this script's own say nothing about a failure."""
    # this script's own: "<string>" under `python -c`, its name as harness/helpers.py runs it
    return filename in ("<string>", globals().get("__file__")) or "importlib._bootstrap" in filename or filename.replace("\\", "/").endswith("/importlib/__init__.py")


def import_error(module, exc):
    frames = [
        "%s:%s in %s" % (f.filename, f.lineno, f.name)
        for f in traceback.extract_tb(exc.__traceback__)
        if not is_machinery(f.filename)
    ]
    return Failure(
        "import_error",
        "importing %s failed: %s: %s" % (module, type(exc).__name__, exc),
        module=module, exc_type=type(exc).__name__, exc_message=str(exc), frames=frames[-6:],
    )


def try_import(name):
    """The module, or None if no module has that name. A module that exists but fails to
    import (including a missing dependency) is a Failure."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as e:
        # Not found only if the missing module is `name` itself (or a parent of it); a missing
        # dependency of an existing module is an import failure.
        if e.name is not None and (name == e.name or name.startswith(e.name + ".")):
            return None
        raise import_error(name, e)
    except (KeyboardInterrupt, MemoryError):
        raise
    except BaseException as e:  # SystemExit and friends from a module body, too
        raise import_error(name, e)


def top_level_names():
    import pkgutil

    names = set(sys.builtin_module_names) | set(dir(builtins))
    try:
        names |= {m.name for m in pkgutil.iter_modules()}
    except Exception:
        pass
    return sorted(names)


def attribute_names(obj):
    names = set()
    try:
        names |= set(dir(obj))
    except Exception:
        pass
    if inspect.ismodule(obj) and hasattr(obj, "__path__"):
        import pkgutil

        try:
            names |= {m.name for m in pkgutil.iter_modules(list(obj.__path__))}
        except Exception:
            pass
    return sorted(names)


def suggest(name, candidates):
    """Close matches, case-insensitively, returned with their real spelling."""
    by_lower = {}
    for c in candidates:
        by_lower.setdefault(c.lower(), c)
    close = difflib.get_close_matches(name.lower(), list(by_lower), n=6, cutoff=0.6)
    # names that merely contain the typed one are often what was meant (forward -> _forward)
    contains = [by_lower[c] for c in by_lower if name.lower() in c and by_lower[c] not in close][:3]
    return [by_lower[c] for c in close] + contains


def not_found(resolved, missing, candidates):
    where = resolved or "the top level"
    return Failure(
        "not_found",
        "%s has no attribute or submodule %r" % (where, missing) if resolved else "no module named %r" % missing,
        resolved=resolved, missing=missing, suggestions=suggest(missing, candidates),
    )


def resolve_import(path):
    """(object, module name, the descriptor found on a class if any) for a dotted path."""
    parts = path.split(".")
    module = try_import(parts[0])
    if module is None:
        if hasattr(builtins, parts[0]):
            obj, used, resolved = builtins, 0, "builtins"
        else:
            raise not_found("", parts[0], top_level_names())
    else:
        obj, used, resolved = module, 1, parts[0]
        while used < len(parts) and hasattr(obj, "__path__"):
            sub = try_import(".".join(parts[: used + 1]))
            if sub is None:
                break
            obj, used, resolved = sub, used + 1, ".".join(parts[: used + 1])
    module_name = resolved
    raw = None
    for name in parts[used:]:
        raw = None
        if inspect.isclass(obj):
            # The raw class attribute shows staticmethod/classmethod/property wrappers.
            try:
                raw = inspect.getattr_static(obj, name)
            except AttributeError:
                raw = None
        try:
            nxt = getattr(obj, name)
        except AttributeError:
            raise not_found(resolved, name, attribute_names(obj))
        except Exception as e:  # a property that raises on the class, a lazy module that fails
            if raw is None:
                raise Failure("attribute_error", "%s.%s raised %s: %s" % (resolved, name, type(e).__name__, e))
            nxt = raw
        obj, resolved = nxt, resolved + "." + name
    return obj, module_name, raw


def code_location(fn):
    code = getattr(fn, "__code__", None)
    if code is None:
        return None
    return "%s:%s" % (code.co_filename, code.co_firstlineno)


def describe(obj):
    """module.qualname. For a function, its CODE's name: functools.wraps copies the wrapped
    function's name onto the wrapper, and the wrapper's own name is what tells them apart."""
    module = getattr(obj, "__module__", None) or ""
    code = getattr(obj, "__code__", None)
    qual = (
        getattr(code, "co_qualname", None) or getattr(code, "co_name", None)  # co_qualname: 3.11+
        or getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None) or type(obj).__name__
    )
    return (module + "." + qual) if module else qual


def unwrap(obj, raw):
    """Follow wrappers to the code that runs; return (object, steps, kind hint)."""
    steps, kind_hint = [], None
    if raw is not None:
        if isinstance(raw, staticmethod):
            steps.append({"how": "staticmethod", "wrapper": "staticmethod", "where": None})
            obj = raw.__func__
        elif isinstance(raw, classmethod):
            steps.append({"how": "classmethod", "wrapper": "classmethod", "where": None})
            obj = raw.__func__
        elif isinstance(raw, property):
            obj, kind_hint = raw, "property"
    seen = set()
    while id(obj) not in seen:
        seen.add(id(obj))
        step = None
        try:
            if isinstance(obj, property) and obj.fget is not None:
                kind_hint = "property"
                step, nxt = ("property (fget)", None), obj.fget
            elif isinstance(obj, (staticmethod, classmethod)):
                step, nxt = (type(obj).__name__, None), obj.__func__
            elif isinstance(obj, functools.cached_property):
                kind_hint = "property"
                step, nxt = ("functools.cached_property", None), obj.func
            elif isinstance(obj, (functools.partial, functools.partialmethod)):
                step, nxt = ("functools.partial", None), obj.func
            elif inspect.ismethod(obj):
                step, nxt = ("bound method", None), obj.__func__
            elif type(obj).__name__ == "OptimizedModule" and hasattr(obj, "_orig_mod"):
                step, nxt = ("torch.compile (OptimizedModule._orig_mod)", None), obj._orig_mod
            elif getattr(obj, "_torchdynamo_orig_callable", None) is not None:
                step, nxt = ("torch.compile / torch._dynamo wrapper", code_location(obj)), obj._torchdynamo_orig_callable
            elif getattr(obj, "__wrapped__", None) is not None and not inspect.isclass(obj):
                step, nxt = ("functools.wraps (__wrapped__)", code_location(obj)), obj.__wrapped__
        except Exception:
            step = None
        if step is None:
            break
        how, where = step
        if how != "bound method":
            steps.append({"how": how, "wrapper": describe(obj), "where": where})
        obj = nxt
    return obj, steps, kind_hint


def is_builtin_like(obj):
    return (
        inspect.isbuiltin(obj)
        or inspect.ismethoddescriptor(obj) and not inspect.isfunction(obj)
        or type(obj).__name__ in ("wrapper_descriptor", "method-wrapper", "builtin_function_or_method", "method_descriptor")
    )


def signature_of(obj):
    try:
        return str(inspect.signature(obj))
    except (TypeError, ValueError):
        text = getattr(obj, "__text_signature__", None)
        return text.replace("$", "") if isinstance(text, str) else None


def live_source(target):
    """file, lines and source of a live object. inspect finds most; frozen stdlib modules
    (os, posixpath... in 3.11+) name "<frozen x>" as their code's file, so fall back to
    parsing the module's __file__ for the object's qualified name."""
    facts = {"file": None}
    try:
        facts["file"] = inspect.getsourcefile(target) or inspect.getfile(target)
    except (TypeError, OSError):
        pass
    if facts["file"] and not facts["file"].startswith("<"):
        try:
            lines, first = inspect.getsourcelines(target)
            first = max(first, 1)  # a module starts at line 1 (inspect says 0)
            facts.update(source="".join(lines), first_line=first, last_line=first + len(lines) - 1)
            return facts
        except (OSError, TypeError, IndentationError, SyntaxError):
            pass
    module = target if inspect.ismodule(target) else sys.modules.get(getattr(target, "__module__", None) or "")
    module_file = getattr(module, "__file__", None)
    if not (isinstance(module_file, str) and module_file.endswith(".py")):
        if facts["file"] is None and module is not None and isinstance(module_file, str):
            facts["file"] = module_file  # a C extension: at least say which shared object
        return facts
    parsed = parse_file(module_file)
    if parsed is None:
        return facts
    text, tree = parsed
    if inspect.ismodule(target):
        facts.update(file=module_file, source=text, first_line=1, last_line=line_count(text))
        return facts
    qualname = getattr(target, "__qualname__", "") or ""
    node = find_definition(tree, qualname.split(".")) if qualname and "<" not in qualname else None
    if node is not None:
        found = definition_facts(node, text, in_class="." in qualname)
        facts.update(file=module_file, source=found["source"], first_line=found["first_line"], last_line=found["last_line"])
    return facts


def resolve_live(path, want_mro):
    obj, module_name, raw = resolve_import(path)
    target, steps, kind_hint = unwrap(obj, raw)
    result = base_result(path, "import")
    result["unwrapped"] = steps
    result["module"] = getattr(target, "__module__", None) if not inspect.ismodule(target) else target.__name__
    if not isinstance(result["module"], str):
        result["module"] = module_name
    result["qualname"] = getattr(target, "__qualname__", None) or getattr(target, "__name__", None) or path.rsplit(".", 1)[-1]
    if inspect.ismodule(target):
        kind = "module"
    elif inspect.isclass(target):
        kind = "class"
    elif kind_hint:
        kind = kind_hint
    elif inspect.isfunction(target):
        kind = "method" if "." in (getattr(target, "__qualname__", "") or "").replace(".<locals>.", "#") else "function"
    elif is_builtin_like(target):
        kind = "builtin"
    elif callable(target):
        kind = "callable object"
    else:
        kind = "data"
    result.update(live_source(target))
    if result["source"] is None:
        # No source: compiled code (a C function, an extension type or module), or a value.
        result["builtin"] = kind in ("builtin", "class", "module")
    file = result["file"]
    if kind in ("data", "callable object"):
        try:
            text = repr(target)
        except Exception as e:
            text = "<repr failed: %s>" % e
        result["value_repr"] = text[:MAX_REPR]
        result["type"] = describe(type(target))
    result["kind"] = kind
    if kind != "data":
        result["signature"] = signature_of(target)
    doc = inspect.getdoc(target) if kind != "data" else None
    result["doc"] = doc
    if inspect.isclass(target):
        result["mro"] = [describe(c) for c in target.__mro__]
    elif want_mro:
        raise Failure("usage", "--mro needs a class, and %s is a %s" % (path, kind))
    top = (result["module"] or module_name).split(".")[0]
    if top in sys.builtin_module_names or not top:
        result["dist"] = {"name": "python (builtin)", "version": sys.version.split()[0]}
    else:
        result["dist"] = distribution_of(top, file)
    if result["dist"] is None:
        version = getattr(sys.modules.get(top), "__version__", None)
        if isinstance(version, str):
            result["dist"] = {"name": top, "version": version}
    return result


def base_result(path, resolution):
    return {
        "ok": True, "op": "object", "path": path, "resolution": resolution, "kind": None,
        "qualname": None, "module": None, "file": None, "first_line": None, "last_line": None,
        "source": None, "signature": None, "doc": None, "mro": None, "decorators": [],
        "unwrapped": [], "builtin": False, "dist": None, "value_repr": None, "type": None,
    }


def inspect_object(request):
    path = request.get("path") or ""
    parts = path.split(".")
    if not path or not all(IDENTIFIER.match(p) for p in parts):
        raise Failure("usage", "expected a dotted Python path like package.module.Class.method, got %r" % path)
    mode = request.get("mode", "auto")
    want_mro = bool(request.get("mro"))
    if mode in ("auto", "static"):
        result = resolve_static(path, want_mro)
        if result is not None:
            return result
        if mode == "static":
            raise Failure("static_unresolved", "%s cannot be resolved without importing (inherited, dynamic or rebound name, builtin, or --mro)" % path)
    return resolve_live(path, want_mro)


# ---------------------------------------------------------------------------------------------
# grep over a package's installed .py files


def grep_package(request):
    package = request.get("package") or ""
    if not all(IDENTIFIER.match(p) for p in package.split(".")):
        raise Failure("usage", "expected a package name like speculators, got %r" % package)
    flags = re.IGNORECASE if request.get("ignore_case") else 0
    try:
        regex = re.compile(request.get("pattern") or "", flags)
    except re.error as e:
        raise Failure("usage", "invalid regular expression %r: %s" % (request.get("pattern"), e))
    parts = package.split(".")
    spec, used = locate_module(parts)
    if spec is None or used != len(parts):
        resolved = ".".join(parts[:used])
        missing = parts[used] if spec is not None else parts[0]
        if spec is None:
            import pkgutil

            candidates = [m.name for m in pkgutil.iter_modules()] + list(sys.builtin_module_names)
        else:
            import pkgutil

            candidates = [m.name for m in pkgutil.iter_modules(list(spec.submodule_search_locations or []))]
        raise not_found(resolved, missing, candidates)
    if spec.submodule_search_locations is not None:
        roots = [os.path.realpath(p) for p in spec.submodule_search_locations]
        files = []
        for root in roots:
            for dirpath, dirnames, filenames in os.walk(root):
                dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
                files += [os.path.join(dirpath, f) for f in sorted(filenames) if f.endswith(".py")]
    elif spec.has_location and spec.origin and spec.origin.endswith(".py"):
        roots, files = [os.path.dirname(os.path.realpath(spec.origin))], [os.path.realpath(spec.origin)]
    else:
        raise Failure("usage", "%s has no Python source to search (origin: %s)" % (package, spec.origin))
    context = max(0, int(request.get("context", 1)))
    max_hits = int(request.get("max_hits", 2000))
    hits, truncated = [], False
    for path in files:
        try:
            text = read_source(path)
        except OSError:
            continue
        if regex.search(text) is None:  # most files do not match: skip the line loop
            continue
        lines = text.split("\n")
        for number, line in enumerate(lines, 1):
            if regex.search(line) is None:
                continue
            if len(hits) >= max_hits:
                truncated = True
                break
            hits.append({
                "file": path,
                "line": number,
                "text": line,
                "before": lines[max(0, number - 1 - context):number - 1],
                "after": lines[number:number + context],
            })
        if truncated:
            break
    return {
        "ok": True, "op": "grep", "package": package, "pattern": regex.pattern, "roots": roots,
        "files_searched": len(files), "hits": hits, "truncated": truncated,
        "dist": distribution_of(parts[0], files[0] if files else None),
    }


# ---------------------------------------------------------------------------------------------


def setup_sys_path(dirs):
    """Mirror `python remote_scripts/x.py`: the stage scripts' directory first, not the cwd."""
    existing = [os.path.abspath(d) for d in dirs or [] if os.path.isdir(d)]
    if existing:
        if sys.path and sys.path[0] == "":
            sys.path.pop(0)
        sys.path[:0] = existing


def answer_for(request):
    """One path's answer, an error included (so one bad path does not hide the others)."""
    try:
        return inspect_object(request)
    except Failure as f:
        return {"ok": False, "path": request.get("path"), "error": f.payload}


def main(argv):
    started = time.perf_counter()
    real_stdout = sys.stdout
    sys.stdout = sys.stderr  # whatever imported libraries print must not corrupt the answer
    try:
        request = json.loads(argv[1] if len(argv) > 1 else sys.stdin.read())
        setup_sys_path(request.get("sys_path"))
        op = request.get("op")
        if op == "object":
            result = inspect_object(request)
        elif op == "objects":  # several paths, one interpreter: heavy imports happen once
            result = {"ok": True, "op": "objects", "results": [answer_for(dict(request, path=p)) for p in request.get("paths") or []]}
        elif op == "grep":
            result = grep_package(request)
        else:
            raise Failure("usage", "unknown op %r" % op)
    except Failure as f:
        result = {"ok": False, "error": f.payload}
    except (KeyboardInterrupt, MemoryError):
        raise
    except BaseException as e:  # a bug here, or a library doing something unheard of
        result = {"ok": False, "error": {"kind": "internal", "message": "%s: %s" % (type(e).__name__, e),
                                         "frames": traceback.format_exc().splitlines()[-8:]}}
    result["python"] = {"executable": sys.executable, "version": sys.version.split()[0]}
    result["elapsed_s"] = round(time.perf_counter() - started, 4)
    real_stdout.write(MARKER + json.dumps(result) + "\n")
    real_stdout.flush()


if __name__ == "__main__":
    main(sys.argv)
