# Validation bits per character against training steps of examples/char_lm, mean over seeds, one
# line per mode, from tools/char_lm_runs.sh's curves.dat:
#   gnuplot -e "data='curves.dat'; modes='fp32 fp8 ...'; output='FILE.png'" tools/char_lm_loss.gp
set terminal pngcairo size 1000,600 font "DejaVu Sans,11" noenhanced
set output output
set title "char_lm on Debian's fortunes: 2 layers, d_model 128, 4 heads, context 64, batch 16, AdamW (mean of seeds 0, 1, 2)"
set xlabel "training step"
set ylabel "validation loss (bits per character)"
set yrange [2:5]
set grid
set key top right
plot for [i=1:words(modes)] data index (i-1) using 1:2 with linespoints pointsize 0.6 title word(modes, i)
