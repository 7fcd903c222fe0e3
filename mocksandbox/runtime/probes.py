"""Small programs that show a language runs, and that each runtime library is there.

``mocksandbox languages --url`` sends them to a deployment; the project's tests run them through
the engine. Each expects ``Success`` and, where given, a substring of stdout.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Probe:
    language: str
    code: str
    #: A substring stdout must hold (``None``: the status alone decides).
    stdout: str | None = "hello"


_JAVA_HELLO = (
    'public class Main {\n  public static void main(String[] a) {\n    System.out.println("hello");\n  }\n}\n'
)
_GO_HELLO = 'package main\n\nimport "fmt"\n\nfunc main() {\n\tfmt.Println("hello")\n}\n'

#: One hello world per language (compiled languages: one compile and run).
HELLO: Mapping[str, Probe] = {
    probe.language: probe
    for probe in (
        Probe("python", 'print("hello")'),
        Probe("pytest", "def test_hello():\n    assert 1 + 1 == 2\n", "1 passed"),
        Probe("cpp", '#include <iostream>\nint main() { std::cout << "hello" << std::endl; }\n'),
        Probe("nodejs", 'console.log("hello")'),
        Probe("typescript", 'const greeting: string = "hello";\nconsole.log(greeting);\n'),
        Probe("jest", "test('adds', () => { expect(1 + 1).toBe(2); });\n", None),
        Probe("go", _GO_HELLO),
        Probe("go_test", 'package main\n\nimport "testing"\n\nfunc TestHello(t *testing.T) {}\n', "ok"),
        Probe("java", _JAVA_HELLO),
        Probe(
            "junit",
            "import org.junit.jupiter.api.Test;\nimport static org.junit.jupiter.api.Assertions.*;\n\n"
            "class HelloTest {\n  @Test\n  void adds() { assertEquals(2, 1 + 1); }\n}\n",
            None,
        ),
        Probe("csharp", 'System.Console.WriteLine("hello");'),
        Probe("rust", 'fn main() {\n    println!("hello");\n}\n'),
        Probe("bash", "echo hello"),
        Probe("php", 'echo "hello\\n";'),
        Probe("lua", 'print("hello")'),
        Probe("R", 'cat("hello\\n")'),
        Probe("perl", 'print "hello\\n";'),
        Probe("ruby", 'puts "hello"'),
        Probe("D_ut", "unittest { assert(1 + 1 == 2); }\n\nvoid main() {}\n", None),
        Probe("scala", 'object Hello {\n  def main(args: Array[String]): Unit = println("hello")\n}\n'),
        Probe("julia", 'println("hello")'),
        Probe("kotlin_script", 'println("hello")'),
        Probe(
            "verilog",
            'module tb;\n  initial begin\n    $display("hello");\n    $finish;\n  end\nendmodule\n',
        ),
        Probe("lean", 'def main : IO Unit := IO.println "hello"\n', None),
        Probe("swift", 'print("hello")'),
        Probe("racket", '#lang racket\n(displayln "hello")\n'),
    )
}

#: Programs that use a runtime library, by library (see ``catalog.LIBRARIES``).
LIBRARY_PROBES: Mapping[str, tuple[Probe, ...]] = {
    "javatuples": (
        Probe(
            "java",
            "import org.javatuples.Pair;\n\npublic class Main {\n  public static void main(String[] a) {\n"
            '    System.out.println(Pair.with("fruit", 2));\n  }\n}\n',
            "[fruit, 2]",
        ),
    ),
    "junit5": (
        Probe(
            "junit",
            "import org.junit.jupiter.api.Test;\nimport static org.junit.jupiter.api.Assertions.*;\n\n"
            "public class Adder {\n  static int add(int a, int b) { return a + b; }\n}\n\n"
            "class AdderTest {\n  @Test\n  void adds() { assertEquals(3, Adder.add(1, 2)); }\n}\n",
            "1 tests successful",
        ),
    ),
    "node_modules": (
        Probe("nodejs", "const _ = require('lodash');\nconsole.log(_.chunk([1, 2, 3], 2).length);\n", "2"),
        Probe(
            "jest",
            "import _ from 'lodash';\n\n"
            "test('chunks', () => {\n  expect(_.chunk([1, 2, 3], 2)).toHaveLength(2);\n});\n",
            None,
        ),
    ),
    "go_modules": (
        Probe(
            "go_test",
            'package main\n\nimport (\n\t"testing"\n\n\t"github.com/stretchr/testify/assert"\n)\n\n'
            "func TestAdd(t *testing.T) {\n\tassert.Equal(t, 3, 1+2)\n}\n",
            "ok",
        ),
    ),
    "python_runtime": (Probe("python", "import numpy, pandas, scipy, sklearn\nprint('hello')\n"),),
    "perl_modules": (
        Probe(
            "perl", 'use Test::Deep;\nuse Data::Compare;\nprint Compare([1], [1]) ? "hello\\n" : "no\\n";\n'
        ),
    ),
    "luaunit": (Probe("lua", "local lu = require('luaunit')\nprint(type(lu.assertEquals))\n", "function"),),
    "mathlib": (
        Probe("lean", "import Mathlib.Data.Real.Basic\n\ntheorem t : (1 : ℝ) + 1 = 2 := by norm_num\n", None),
    ),
}
