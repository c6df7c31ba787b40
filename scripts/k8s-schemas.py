#!/usr/bin/env python3
"""Kubernetes' OpenAPI (swagger 2.0) document -> kubeconform's standalone strict JSON schemas.

    python3 scripts/k8s-schemas.py swagger.json OUT_DIR

Writes OUT_DIR/master-standalone-strict/<kind>[-<group>]-<version>.json, one file a kind, the names and layout
of kubeconform's default schema location (its -schema-location template
'{{ .NormalizedKubernetesVersion }}-standalone{{ .StrictSuffix }}/{{ .ResourceKind }}{{ .KindSuffix }}.json'
with -kubernetes-version master), as its own openapi2jsonschema.py makes them:

- standalone: every $ref inlined (a reference back into itself, as in a CRD's JSONSchemaProps, accepts anything);
- strict: an object with declared properties takes no other (additionalProperties: false), so a misspelt or
  misplaced field fails (kubeconform -strict);
- IntOrString and Quantity take a string or a number (`port: 8080`, `cpu: 1`), declared fields may be null;
- apiVersion and kind are pinned to the kind's own.

Only the Python standard library; no network.
"""
import copy
import json
import os
import sys

REF = '#/definitions/'


def main(src: str, out: str) -> int:
    with open(src, encoding='utf-8') as f:
        defs = json.load(f)['definitions']

    special = {
        'io.k8s.apimachinery.pkg.util.intstr.IntOrString': {'oneOf': [{'type': 'string'}, {'type': 'integer'}]},
        'io.k8s.apimachinery.pkg.api.resource.Quantity': {'oneOf': [{'type': 'string'}, {'type': 'number'}]},
    }

    memo: dict = {}

    def strictify(s: dict) -> dict:
        if isinstance(s, dict) and 'properties' in s and 'additionalProperties' not in s:
            s['additionalProperties'] = False
        return s

    def nullable(s: dict) -> dict:
        t = s.get('type')
        if isinstance(t, str):
            s['type'] = [t, 'null']
        elif 'oneOf' in s:
            s = {'oneOf': s['oneOf'] + [{'type': 'null'}], **{k: v for k, v in s.items() if k != 'oneOf'}}
        return s

    def resolve(node, stack: tuple):
        if isinstance(node, list):
            return [resolve(x, stack) for x in node]
        if not isinstance(node, dict):
            return node
        if '$ref' in node:
            name = node['$ref'][len(REF):]
            return definition(name, stack)
        outn = {}
        for k, v in node.items():
            if k == 'properties':
                outn[k] = {p: nullable(copy.copy(resolve(ps, stack))) for p, ps in v.items()}
            elif k in ('items', 'additionalProperties', 'allOf', 'anyOf', 'oneOf', 'not'):
                outn[k] = resolve(v, stack)
            elif k == 'format' and v == 'int-or-string':
                continue
            elif k.startswith('x-kubernetes-') or k == 'description':
                continue
            else:
                outn[k] = v
        return strictify(outn)

    def definition(name: str, stack: tuple):
        if name in special:
            return copy.deepcopy(special[name])
        if name in stack:
            return {}  # recursive (JSONSchemaProps): anything
        if name in memo:
            return memo[name]
        r = resolve(defs[name], stack + (name,))
        memo[name] = r
        return r

    target = os.path.join(out, 'master-standalone-strict')
    os.makedirs(target, exist_ok=True)
    written = 0
    for name, d in sorted(defs.items()):
        for gvk in d.get('x-kubernetes-group-version-kind', []):
            group, version, kind = gvk.get('group', ''), gvk['version'], gvk['kind']
            suffix = ('-' + group.split('.')[0].lower() if group else '') + '-' + version.lower()
            path = os.path.join(target, kind.lower() + suffix + '.json')
            # Meta kinds (DeleteOptions, WatchEvent, Status...) are listed under many groups: the first one wins.
            if os.path.exists(path):
                continue
            schema = copy.deepcopy(definition(name, ()))
            props = schema.get('properties', {})
            if 'apiVersion' in props:
                props['apiVersion'] = {'type': 'string', 'enum': [f'{group}/{version}' if group else version]}
            if 'kind' in props:
                props['kind'] = {'type': 'string', 'enum': [kind]}
            schema['$schema'] = 'http://json-schema.org/schema#'
            with open(path, 'w', encoding='utf-8') as f:
                json.dump(schema, f, separators=(',', ':'))
            written += 1
    print(f'{written} schemas in {target}', file=sys.stderr)
    return 0 if written else 1


if __name__ == '__main__':
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    sys.exit(main(sys.argv[1], sys.argv[2]))
