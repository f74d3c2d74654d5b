# Scale history of an AutoScale run: each op's propagation scale at every measurement (analysis,
# scheduled re-measurement, final check), from the CSV that scaling_report::write_history_csv writes
# (fashion_mnist --mode fp8-autoscale --autoscale-history FILE). Forward ops on the left, backward
# ops on the right; ops on are solid, frozen ops dashed (their last point is the final check);
# warnings are red circles.
#
#   gnuplot -e "data='docs/figures/autoscale_history.csv'; out='docs/figures/autoscale_history.png'" \
#           docs/figures/autoscale_history.gp
if (!exists("data")) data = 'docs/figures/autoscale_history.csv'
if (!exists("out")) out = 'docs/figures/autoscale_history.png'

set datafile separator ','
set terminal pngcairo size 1400,560 font 'DejaVu Sans,10' noenhanced
set output out
set multiplot layout 1,2 title 'AutoScale propagation scales over training (Fashion-MNIST MLP, fp8-autoscale, on_off(1/3, 1/20))'
set logscale y 2
set format y '2^%L'
set xlabel 'use of the op (training step)'
set ylabel 'propagation scale'
set key outside right top font ',8'
set grid ytics

fwd = system(sprintf("tail -n +2 '%s' | cut -d, -f1 | grep -E '[.](x|w|y)$' | uniq", data))
bwd = system(sprintf("tail -n +2 '%s' | cut -d, -f1 | grep -E '[.](g|grad_x|grad_w)$' | uniq", data))
rows(op) = sprintf("< grep '^%s,' '%s'", op, data)
state(op) = system(sprintf("grep -m1 '^%s,' '%s' | cut -d, -f2", op, data))
style(op) = state(op) eq 'frozen' ? 2 : 1

set title 'forward: casts of x and w, products y'
plot for [i=1:words(fwd)] rows(word(fwd, i)) using 3:5 with steps dt style(word(fwd, i)) lw 1.5 title word(fwd, i), \
     for [i=1:words(fwd)] rows(word(fwd, i)) using 3:($6 > 0 ? $5 : 1/0) with points pt 6 ps 1.5 lc rgb 'red' notitle
set title 'backward: cotangent casts g, products grad_x and grad_w'
plot for [i=1:words(bwd)] rows(word(bwd, i)) using 3:5 with steps dt style(word(bwd, i)) lw 1.5 title word(bwd, i), \
     for [i=1:words(bwd)] rows(word(bwd, i)) using 3:($6 > 0 ? $5 : 1/0) with points pt 6 ps 1.5 lc rgb 'red' notitle
unset multiplot
