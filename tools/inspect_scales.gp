# Scales (log2) and data RMS per op of one training step, forward and backward, from the CSV that
# ad::inspection::write_csv writes (fashion_mnist / char_lm --inspect=FILE.csv; docs/inspect.md).
# x: the op's node on the tape (parameters first, labelled by name). Blue: forward (each op's
# output, filled; the matmul operands' casts to the recipe's forward format, open triangles).
# Red: backward (the cotangent reaching each op, filled; its cast to the gradient format, open
# diamonds; the parameters' gradients, open squares). Dashed lines on the right: E4M3's and
# E5M2's largest values and smallest normals, the range cast data must fall in.
#
#   gnuplot -e "data='docs/figures/inspect_fashion_mnist_fp8.csv'; out='docs/figures/inspect_fashion_mnist_fp8.png'" \
#           tools/inspect_scales.gp
# Optional: title='...'.
if (!exists("data")) data = 'docs/figures/inspect_fashion_mnist_fp8.csv'
if (!exists("out")) out = 'docs/figures/inspect_fashion_mnist_fp8.png'
if (!exists("title")) title = 'One step under the recipe: scales and data RMS per op (ad::inspect, '.data.')'

set datafile separator ','
set datafile missing 'nan'
set terminal pngcairo size 1500,640 font 'DejaVu Sans,10' noenhanced
set output out
set multiplot layout 1,2 title title

# Rows of one kind (column 5, tensor), the parameters' rows (op "parameter") apart.
ops(kind) = sprintf("< awk -F, '$5 == \"%s\" && $2 != \"parameter\"' '%s'", kind, data)
params(kind) = sprintf("< awk -F, '$5 == \"%s\" && $2 == \"parameter\"' '%s'", kind, data)
label(op, name) = op eq 'parameter' ? name : op
set xtics rotate by 60 right font ',8'
set grid ytics
set key outside below maxrows 2 font ',9'
set xlabel 'node (op, in recording order)'

set title 'scale (log2): value = data x scale'
set offsets 0.5, 0.5, 1, 1
set ylabel 'log2(scale)'
plot ops('value') using 1:11:xtic(label(strcol(2), strcol(3))) with linespoints pt 7 lc rgb '#377eb8' title 'forward: op output', \
     params('value') using 1:11:xtic(label(strcol(2), strcol(3))) with points pt 6 ps 1.3 lc rgb '#377eb8' title 'parameter', \
     ops('cast_a') using 1:11 with points pt 8 ps 1.4 lc rgb '#377eb8' title 'matmul operand a as cast', \
     ops('cast_b') using 1:11 with points pt 10 ps 1.4 lc rgb '#4daf4a' title 'matmul operand b as cast', \
     ops('cotangent') using 1:11 with linespoints pt 5 lc rgb '#e41a1c' title 'backward: cotangent reaching the op', \
     ops('cast_cotangent') using 1:11 with points pt 12 ps 1.6 lc rgb '#e41a1c' title 'cotangent as cast', \
     params('gradient') using 1:11 with points pt 4 ps 1.3 lc rgb '#e41a1c' title 'parameter gradient'

set title 'data RMS (the scale left out)'
set offsets 0.5, 0.5, 0, 0
set ylabel 'data RMS'
set logscale y 2
set format y '2^%L'
set yrange [2**-17:2**19]
set arrow 1 from graph 0, first 448 to graph 1, first 448 nohead dt 2 lc rgb '#777777'
set arrow 2 from graph 0, first 2**-6 to graph 1, first 2**-6 nohead dt 2 lc rgb '#777777'
set arrow 3 from graph 0, first 57344 to graph 1, first 57344 nohead dt 3 lc rgb '#777777'
set arrow 4 from graph 0, first 2**-14 to graph 1, first 2**-14 nohead dt 3 lc rgb '#777777'
set label 1 'E4M3 max 448' at graph 1, first 448 right offset -0.5,0.6 font ',8' tc rgb '#555555'
set label 2 'E4M3 min normal 2^-6' at graph 1, first 2**-6 right offset -0.5,0.6 font ',8' tc rgb '#555555'
set label 3 'E5M2 max 57344' at graph 1, first 57344 right offset -0.5,0.6 font ',8' tc rgb '#555555'
set label 4 'E5M2 min normal 2^-14' at graph 1, first 2**-14 right offset -0.5,0.6 font ',8' tc rgb '#555555'
plot ops('value') using 1:12:xtic(label(strcol(2), strcol(3))) with linespoints pt 7 lc rgb '#377eb8' title 'forward: op output', \
     params('value') using 1:12:xtic(label(strcol(2), strcol(3))) with points pt 6 ps 1.3 lc rgb '#377eb8' title 'parameter', \
     ops('cast_a') using 1:12 with points pt 8 ps 1.4 lc rgb '#377eb8' title 'matmul operand a as cast', \
     ops('cast_b') using 1:12 with points pt 10 ps 1.4 lc rgb '#4daf4a' title 'matmul operand b as cast', \
     ops('cotangent') using 1:12 with linespoints pt 5 lc rgb '#e41a1c' title 'backward: cotangent reaching the op', \
     ops('cast_cotangent') using 1:12 with points pt 12 ps 1.6 lc rgb '#e41a1c' title 'cotangent as cast', \
     params('gradient') using 1:12 with points pt 4 ps 1.3 lc rgb '#e41a1c' title 'parameter gradient'
unset multiplot
