# Static SASS instruction counts a kernel, by opcode, from an `nvdisasm -gi` listing (build1.sh's
# DIR.sass): `python3 sass_counts.py DIR.sass` (twenty-fifth session).
import re,sys,collections
txt=open(sys.argv[1]).read()
funcs=re.split(r'\n\s*\.text\.(\S+):', txt)
for i in range(1,len(funcs),2):
    name=funcs[i]; body=funcs[i+1]
    m=re.search(r'ELi(\d+)ELi(\d+)ELi(\d+)ELb(\d)ELb(\d)ELb(\d)',name)
    ins=re.findall(r'/\*[0-9a-f]{4,}\*/\s+([^;]*);',body)
    ops=collections.Counter()
    for s in ins:
        s=re.sub(r'^@!?U?P\w+\s+','',s.strip())
        ops[s.split()[0].split('.')[0]]+=1
    tot=sum(ops.values())
    print(name[:30], m.groups() if m else '', tot, ' '.join(f'{k}:{v}' for k,v in ops.most_common(16)))
